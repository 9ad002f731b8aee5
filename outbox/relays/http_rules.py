"""HTTP as the webhook relay speaks it: what an answer means for the message (delivered,
retried after the delay the server asked for, or dead), which URLs and configured headers
it can send, and how a URL is shown in errors (without the secrets it may hold)."""

from __future__ import annotations

import re
import time
from datetime import timezone
from email.utils import parsedate_to_datetime
from urllib.parse import quote, urlsplit

from outbox.exceptions import OutboxError, PermanentFailure, RetryLater
from outbox.headers import HTTP_FRAMING, control_character, is_token

__all__ = ["WebhookError", "ce_header_value", "header_problem", "judge", "retry_after"]

# How much of a refused request's answer goes into its error (and a dead letter's).
EXCERPT_CHARS = 200
# CloudEvents binary mode: header values percent-encode space, '"', '%' and anything
# outside printable ASCII (CloudEvents HTTP protocol binding, 3.1.3.2).
_CE_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in ' "%')
_SECONDS = re.compile(r"\d+(\.\d+)?")


class WebhookError(OutboxError):
    """A webhook request that failed: `status` is the HTTP status of the answer, or None
    when there was none (a timeout, a refused connection)."""

    def __init__(self, text: str, status: int | None = None) -> None:
        super().__init__(text)
        self.status = status


def judge(
    status: int, reason: str, body: str, retry_after_header: str | None, request: str
) -> None:
    """Return if the answer delivered the message (a 2xx); else raise what it means:
    `PermanentFailure` for 410 Gone, `RetryLater` for a 429 or 5xx with a readable
    ``Retry-After``, `WebhookError` (an ordinary failure, backed off) for the rest.
    The error names the request, the status and the start of the answer's body."""
    if 200 <= status < 300:
        return
    excerpt = " ".join(body.split())[:EXCERPT_CHARS]
    text = f"{request} answered {status} {reason}: {excerpt!r}"
    if status == 410:
        raise PermanentFailure(f"{text} (410 Gone: the endpoint will never take it)")
    if status == 429 or status >= 500:
        delay = retry_after(retry_after_header)
        if delay is not None:
            raise RetryLater(delay, f"{text}; retry in {delay:g} s, as it asked")
    raise WebhookError(text, status)


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds (given as seconds or as an
    HTTP date; a date past is no delay); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is in GMT
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def ce_header_value(value: str) -> str:
    """A CloudEvents attribute as a ``ce-`` header value."""
    return quote(value, safe=_CE_SAFE)


def header_problem(name: object, value: object) -> str | None:
    """Why a relay cannot send the header `name` of its configuration with `value`, or
    None: a name must be an HTTP token, a value text without control characters, and
    neither framing nor routing (``content-length``, ``host``...), which the client
    sets from the request itself."""
    if not isinstance(name, str) or not isinstance(value, str):
        return f"header {name!r} must be a str with a str value."
    if not is_token(name):
        return f"header {name!r} is not an HTTP token, which a header name must be."
    character = control_character(value)
    if character is not None:
        return f"header {name!r} has a control character ({character!r}) in its value."
    if name.lower() in HTTP_FRAMING:
        return f"header {name!r} frames or routes the request: the client sets it itself."
    return None


def url_problem(url: object) -> str | None:
    """Why `url` cannot be a webhook's URL, or None."""
    if not isinstance(url, str):
        return f"url must be a str, not {type(url).__name__}."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (reading the port validates it)
    except ValueError as error:
        return f"url does not parse: {error}."
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"url {shown_url(url)!r} is not an http:// or https:// URL with a host."
    return None


def shown_url(url: str) -> str:
    """The URL as errors show it: without credentials or query, which may hold secrets."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
