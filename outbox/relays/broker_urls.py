"""Broker URLs (AMQP, Redis) as errors and logs show them, and what is wrong with one.

A broker URL may carry secrets: a user name and password before the host, tokens in
its query. `shown_url` keeps the scheme, host, port and path only. `url_problem` says
what is wrong in its own words: a parser's error quotes the text it could not read, and
in a URL whose password holds a ``/``, ``?`` or ``;`` (not percent-encoded) that text is
the password.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["shown_url", "url_problem"]

# Where the next fail-over URL starts when showing: a ';' before a scheme and "://", so
# that a ';' in a password or a query does not expose what follows it as a host.
_NEXT_URL = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_ENCODE = "percent-encode any of : / ? # [ ] @ ; in its user name or password"


def shown_url(url: str) -> str:
    """`url` (each of its ``;``-separated fail-over URLs) as errors show it: scheme, host,
    port and path, with "…" in place of the user name and password and of the query or
    fragment. Everything up to the last "@" counts as credentials and from the first "?"
    or "#" as query; when that "?" comes before that "@", either may hold the secret,
    and only the scheme is shown."""
    return ";".join(_shown_one(one) for one in _NEXT_URL.split(url))


def _shown_one(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    at = rest.rfind("@")
    cut = min([found for found in (rest.find("?"), rest.find("#")) if found >= 0] or [len(rest)])
    if cut < at:
        return f"{scheme}{separator}…"
    credentials = "…@" if at >= 0 else ""
    query = f"{rest[cut]}…" if cut < len(rest) else ""
    return f"{scheme}{separator}{credentials}{rest[at + 1 : cut]}{query}"


def url_problem(
    url: object, schemes: Sequence[str], kind: str, *, fail_over: bool = False
) -> str | None:
    """Why `url` is not `kind` URL ("an AMQP") with one of `schemes`, or None; with
    `fail_over`, why one of its ``;``-separated URLs (split as kombu splits them) is
    not. The URL is named as `shown_url` shows it."""
    if not isinstance(url, str):
        return f"url must be a str, not {type(url).__name__}."
    several = url.split(";") if fail_over else [url]
    for position, one in enumerate(several, 1):
        problem = _problem(one, schemes, kind)
        if problem is not None:
            which = f" (fail-over URL {position} of {len(several)})" if len(several) > 1 else ""
            return f"url {shown_url(url)!r}{which} {problem}"
    return None


def _problem(url: str, schemes: Sequence[str], kind: str) -> str | None:
    """What is wrong with one URL, in words that quote none of it."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"does not parse as a URL: check the [brackets] of an IPv6 host, and {_ENCODE}."
    if parts.scheme not in schemes:
        return f"is not {kind} URL: it must start with {' or '.join(s + '://' for s in schemes)}."
    try:
        parts.port  # noqa: B018  (reading it checks it)
    except ValueError:
        return f"does not parse: its port is not a number from 0 to 65535 ({_ENCODE})."
    return None
