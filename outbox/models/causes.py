"""The cause of a dead letter: which receiver failed, with which exception, and its
message with the values that vary from one message to the next masked.

The engine writes `last_error` with `error_line`: one entry per failing receiver,
`<receiver id>: <exception type>: <message>` (the exception as
`traceback.format_exception_only` shows it, which may span lines). `cause_of` reads it
back. Rows written before every entry named its receiver (a lone failing receiver was
written without its name) read as failures of an unknown receiver.

Two dead letters have the same cause when their failures match entry by entry on the
receiver, the exception type and the normalised message: quoted values, UUIDs, hex ids
and numbers masked (`normalise`). A cause's `key` is a short hash of that, stable across
processes and releases of the same format, for the command line and URLs.
"""

from __future__ import annotations

import hashlib
import re
import traceback
from dataclasses import dataclass
from functools import cached_property, lru_cache

from outbox.shown_text import one_line

# Only the start of `last_error` decides a cause: every reader reads this much of it.
CAUSE_CHARS = 1000
KEY_LENGTH = 12

_KEY = re.compile(rf"[0-9a-f]{{{KEY_LENGTH}}}")
# A receiver id (`module.qualname`, so always dotted) before an exception whose type's
# last part is capitalised, as classes are: `app.receivers.sync: ValueError: bad`.
_RECEIVER_ENTRY = re.compile(
    r"(?P<receiver>[A-Za-z_][\w<>]*(?:\.[\w<>]+)+): "
    r"(?P<rest>(?:[A-Za-z_][\w<>]*\.)*[A-Z]\w*(?:: .*)?)"
)
_EXCEPTION = re.compile(r"(?P<type>(?:[A-Za-z_][\w<>]*\.)*[A-Za-z_]\w*)(?:: (?P<message>.*))?")

# What `normalise` masks, in this order (a quoted value may hold a number, a UUID digits).
_MASKS = [
    (re.compile(r"(?<!\w)'[^'\n]*'(?!\w)"), "<str>"),
    (re.compile(r'(?<!\w)"[^"\n]*"(?!\w)'), "<str>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # A run of 8 or more hex digits with at least one digit and one letter.
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # Digits not glued to a letter: `order_17`, `10.0.0.3`, `30s` are masked; `utf8`,
    # `sha256`, `http2` are names and kept.
    (re.compile(r"(?<![A-Za-z\d])\d+"), "<n>"),
]
_SPACES = re.compile(r"\s+")


def error_line(receiver: str, exc: BaseException) -> str:
    """One failure as `last_error` records it: the receiver id (when known), then the
    exception as `traceback.format_exception_only` shows it."""
    shown = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return f"{receiver}: {shown}" if receiver else shown


def normalise(message: str) -> str:
    """The message with quoted values, UUIDs, hex ids and numbers masked, and its
    whitespace collapsed: `order 17 of 'acme'` -> `order <n> of <str>`."""
    for pattern, mask in _MASKS:
        message = pattern.sub(mask, message)
    return _SPACES.sub(" ", message).strip()


def is_cause_key(text: str) -> bool:
    """Whether `text` is shaped like a cause key (12 lowercase hex digits)."""
    return _KEY.fullmatch(text) is not None


@dataclass(frozen=True)
class Failure:
    """One receiver's failure: its id ("" when not recorded), the exception type as
    recorded (dotted unless built in; "" when unreadable) and the normalised message."""

    receiver: str
    exception: str
    message: str

    def __str__(self) -> str:
        # The message is a receiver's text: escaped, it shows on one line, sends no
        # terminal escapes (normalising collapsed its whitespace only).
        shown = self.exception + (f": {one_line(self.message)}" if self.message else "")
        return f"{self.receiver or 'unknown receiver'}: {shown}"


@dataclass(frozen=True)
class Cause:
    """Why a dead letter failed: the failures of its last attempt, in receiver order."""

    failures: tuple[Failure, ...]

    @cached_property
    def key(self) -> str:
        canonical = "\n".join(
            f"{failure.receiver}\t{failure.exception}\t{failure.message}"
            for failure in self.failures
        )
        return hashlib.blake2b(canonical.encode(), digest_size=KEY_LENGTH // 2).hexdigest()

    def __str__(self) -> str:
        return "; ".join(map(str, self.failures))


@lru_cache(maxsize=1024)
def cause_of(last_error: str) -> Cause:
    """The cause recorded in a dead letter's `last_error` (its first CAUSE_CHARS
    characters: what every reader reads). Cached: dead letters of one cause often share
    their error text."""
    entries: list[tuple[str, list[str]]] = []
    for line in last_error[:CAUSE_CHARS].splitlines():
        entry = _RECEIVER_ENTRY.fullmatch(line)
        if entry is not None:
            entries.append((entry["receiver"], [entry["rest"]]))
        elif entries:  # the next line of a message that spans lines
            entries[-1][1].append(line)
        else:
            entries.append(("", [line]))
    if not entries:
        return Cause((Failure("", "", ""),))
    return Cause(tuple(_failure(receiver, lines) for receiver, lines in entries))


def _failure(receiver: str, lines: list[str]) -> Failure:
    shown = _EXCEPTION.fullmatch(lines[0])
    if shown is None:
        return Failure(receiver, "", normalise(" ".join(lines)))
    message = " ".join([shown["message"] or "", *lines[1:]])
    return Failure(receiver, shown["type"], normalise(message))
