"""The cause of a dead letter: which receiver failed, with which exception, and its
message with the values that vary from one message to the next masked.

The engine writes `last_error` with `error_line`: one entry per failing receiver,
`<receiver id>: <exception type>: <message>` (the exception as
`traceback.format_exception_only` shows it, which may span lines). `cause_of` reads it
back. Rows written before every entry named its receiver (a lone failing receiver was
written without its name) read as failures of an unknown receiver.

Two dead letters have the same cause when their failures match entry by entry on the
receiver, the exception type and the normalised message: what varies from one message to
the next masked (`normalise`), so that the messages of one cause read the same and those
of two causes differ. A cause's `key` is a short hash of that, stable across processes
and releases of the same normalisation, for the command line and URLs; it is derived
whenever a cause is read, never stored (the admin log quotes it).
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

# A quoted text, in single or double quotes (`can't` holds no quoted text).
_QUOTED = re.compile(r"""(?<!\w)(?P<quote>['"])(?P<text>(?:(?!(?P=quote)).)*)(?P=quote)(?!\w)""")
# Exceptions whose message quotes names, not values: the missing key, attribute, module
# or field (`KeyError: 'email'`), compared on the type's last dotted part.
_QUOTING_NAMES = frozenset({
    "KeyError", "AttributeError", "NameError", "ImportError", "ModuleNotFoundError",
    "MultiValueDictKeyError", "FieldDoesNotExist", "FieldError",
})  # fmt: skip
# A name such an exception quotes: an identifier, perhaps dotted (`crm.client`).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Ids of a fixed shape; the lookarounds treat `_` as a separator, as in `order_<uuid>`.
_UUID = re.compile(
    r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}(?![0-9A-Za-z])"
)
_HEX_LITERAL = re.compile(r"(?<![0-9A-Za-z])0x[0-9a-fA-F]+")
# A word: letters and digits (`_` and `-` separate words), with the `-8` of `utf-8` or
# the `-01-31` of a date when they end it (`order-0000040f` is two words).
_WORD = re.compile(r"[A-Za-z0-9]+(?:-[0-9]+(?![A-Za-z0-9]))*")
# The numbers and ids in a word, decimal or hex, under one mask: the same zero-padded id
# shows as `00000419` or `0000040f`, and an 8-digit hex id has no letter one time in 40.
# A hex run has 8 or more digits, at least one of them decimal (`deadbeef` is a word).
_NUMBER = re.compile(r"(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}|[0-9]+")
# Words whose digits are part of a name, not a number, kept as written (compared in
# lowercase); every other word has its numbers masked, `c1049` as `c<n>`. A name missing
# here splits nothing: it reads `sha<n>` for every message alike.
_NAMES_WITH_DIGITS = frozenset({
    "utf8", "utf8mb3", "utf8mb4", "utf16", "utf32", "utf-8", "utf-16", "utf-32", "ucs2",
    "ucs4", "latin1", "latin-1", "iso-8859-1", "iso-8859-15", "cp1252", "windows-1252",
    "md5", "sha1", "sha224", "sha256", "sha384", "sha512", "sha-1", "sha-256", "sha-512",
    "sha3", "blake2b", "blake2s", "crc32", "base32", "base64", "base85", "x509", "pkcs7",
    "pkcs8", "pkcs12", "ed25519", "aes128", "aes256", "http2", "http3", "h2", "h3", "ipv4",
    "ipv6", "oauth1", "oauth2", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "float16", "float32", "float64", "s3", "ec2", "i18n", "l10n", "k8s",
})  # fmt: skip
_SPACES = re.compile(r"\s+")


def error_line(receiver: str, exc: BaseException) -> str:
    """One failure as `last_error` records it: the receiver id (when known), then the
    exception as `traceback.format_exception_only` shows it."""
    shown = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return f"{receiver}: {shown}" if receiver else shown


def normalise(message: str, quotes_names: bool = False) -> str:
    """The message with what varies from one message to the next masked, and its
    whitespace collapsed: `order 17 of 'acme'` -> `order <n> of <str>`.

    Masked, in this order: quoted texts as `<str>` (but when `quotes_names`, as for a
    KeyError, a quoted identifier is a name and kept: `'customer_id'`); UUIDs as
    `<uuid>`; `0x` literals as `<hex>`; then in every word, numbers and runs of 8 or more
    hex digits as `<n>` (`order_17x` -> `order_<n>x`, `0000040f` -> `<n>`), except in
    names whose digits are part of them (`utf8`, `sha256`, `IPv4`: `_NAMES_WITH_DIGITS`).
    """
    message = _QUOTED.sub(_quoted_name if quotes_names else "<str>", message)
    message = _UUID.sub("<uuid>", message)
    message = _HEX_LITERAL.sub("<hex>", message)
    message = _WORD.sub(_word_masked, message)
    return _SPACES.sub(" ", message).strip()


def _quotes_names(exception: str) -> bool:
    """Whether messages of this exception type (as recorded) quote names, not values."""
    return exception.rpartition(".")[2] in _QUOTING_NAMES


def _quoted_name(quoted: re.Match[str]) -> str:
    # Kept with its quotes; its digits are masked with the other words' (`'user_<n>'`).
    return quoted[0] if _NAME.fullmatch(quoted["text"]) else "<str>"


def _word_masked(word: re.Match[str]) -> str:
    if word[0].lower() in _NAMES_WITH_DIGITS:
        return word[0]
    return _NUMBER.sub("<n>", word[0])


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
    return Failure(receiver, shown["type"], normalise(message, _quotes_names(shown["type"])))
