"""Text the app does not control (a receiver's exception, its traceback, an object
identifier) made safe for a log record or a terminal: its control characters escaped,
so that it can neither start a line of its own (a forged log line) nor send terminal
escapes, and its length bounded, cut with a marker that says how much went.
"""

from __future__ import annotations

import re
import traceback

__all__ = ["LINE_LIMIT", "one_line", "shown_traceback"]

# How much of one text a log line or a command's line shows, in characters.
LINE_LIMIT = 1000

# C0 and C1 controls and DEL; the characters `str.splitlines` also breaks at (\x85 is
# C1); and the bidirectional overrides, which reorder what a terminal shows.
_BEYOND_C0 = r"\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(rf"[\x00-\x1f{_BEYOND_C0}]")
_CONTROL_BUT_NEWLINE = re.compile(rf"[\x00-\x09\x0b-\x1f{_BEYOND_C0}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """`text` as one line: past `limit` characters cut, with a marker saying how many
    went, then every control character escaped (newline as ``\\n``, ESC as ``\\x1b``
    ...). At most `limit` characters of `text` are shown, each in at most 6."""
    cut = len(text) - limit
    if cut > 0:
        text = f"{text[:limit]}… [cut {cut:,} characters]"
    return _CONTROL.sub(_escaped, text)


def shown_traceback(exc: BaseException, limit: int) -> str:
    """`exc`'s traceback as `traceback.format_exception` shows it (its chain of causes,
    its frames), but with each exception's own text (the type and message, which may
    span lines) as `one_line`, every other control character but the newline escaped,
    and only its last `limit` characters kept: a marker on the first line says how
    many went. So each line is the traceback's own, never one of the message's."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # The longest first: an exception's text that holds another's is escaped whole.
    for raw in sorted(_exception_texts(exc), key=len, reverse=True):
        text = text.replace(raw, one_line(raw.rstrip("\n")) + "\n")
    text = _CONTROL_BUT_NEWLINE.sub(_escaped, text)
    cut = len(text) - limit
    # The marker opens the line the cut text continues: no line starts mid-text.
    return f"… [cut {cut:,} characters] {text[cut:]}" if cut > 0 else text


def _exception_texts(exc: BaseException) -> set[str]:
    """The text `traceback.format_exception_only` shows for `exc` and each exception of
    the chain `format_exception` follows (its cause, else its context)."""
    texts: set[str] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.add("".join(traceback.format_exception_only(type(current), current)))
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__
    return texts


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
