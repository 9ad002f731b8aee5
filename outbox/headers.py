"""The headers a writer may set on a message, and the one rule every relay applies.

A message's headers travel as its relay's transport carries headers: HTTP headers, AMQP
headers, Kafka headers, Redis stream fields, a Celery task message's headers. Some names
mean something to the transport itself, so a writer must not be able to set them:

1. ``outbox-*`` names are the relays' own (the message id consumers deduplicate by, the
   category, the shard, the attempt): refused when a row is written; a relay's own
   headers always replace a writer's of the same name.
2. Names a transport gives a meaning of its own are refused when a row is written:
   HTTP's framing and routing (``content-length``, ``transfer-encoding``, ``host``,
   ``connection``, ``te``, ``upgrade``, ``expect``...), credentials (``authorization``,
   ``proxy-authorization``, unless ``OUTBOX_WRITER_HEADERS_ALLOWED`` lists them) and
   Celery's protocol headers (``task``, ``id``, ``eta``...), which pick the task a
   worker runs and when.
3. A name is an HTTP token (letters, digits and ``!#$%&'*+-.^_`|~``), a value has no
   control character but tab. Names are compared without regard to case.

Rows written before a rule existed are held to it when sent: `writer_headers` leaves out
what a writer may not set, so a relay never sends it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from outbox.conf import outbox_settings
from outbox.exceptions import InvalidOutboxMessage

__all__ = [
    "CREDENTIALS",
    "HTTP_FRAMING",
    "RELAY_PREFIX",
    "RESERVED",
    "allowed_credentials",
    "check_writer_header",
    "control_character",
    "is_token",
    "reserved_because",
    "writer_headers",
]

RELAY_PREFIX = "outbox-"

# HTTP: a writer's value would change how the request is framed or routed.
HTTP_FRAMING = frozenset(
    {
        "connection",
        "content-length",
        "expect",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Credentials: a relay's own, unless the project lets writers set them.
CREDENTIALS = frozenset({"authorization", "proxy-authorization"})
# Celery: the task message's protocol headers and the task request's fields a header
# would fill (celery.app.amqp.as_task_v2, celery.app.task.Context).
_CELERY = frozenset(
    {
        "argsrepr",
        "args",
        "callbacks",
        "chain",
        "chord",
        "correlation_id",
        "delivery_info",
        "errbacks",
        "eta",
        "expires",
        "group",
        "group_index",
        "hostname",
        "id",
        "ignore_result",
        "is_eager",
        "kwargs",
        "kwargsrepr",
        "lang",
        "origin",
        "parent_id",
        "properties",
        "replaced_task_nesting",
        "reply_to",
        "retries",
        "root_id",
        "shadow",
        "soft_time_limit",
        "stamped_headers",
        "stamps",
        "task",
        "taskset",
        "time_limit",
        "timelimit",
        "utc",
    }
)
RESERVED: Mapping[str, str] = {
    **dict.fromkeys(HTTP_FRAMING, "HTTP gives it a meaning of its own"),
    **dict.fromkeys(CREDENTIALS, "a relay's credentials are its own"),
    **dict.fromkeys(_CELERY, "Celery reads it as a protocol header of the task message"),
}

_TOKEN = re.compile(r"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def is_token(name: str) -> bool:
    """Whether `name` is an HTTP token, as every header name must be."""
    return _TOKEN.fullmatch(name) is not None


def control_character(text: str) -> str | None:
    """The first control character in `text` (tab aside), or None."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def allowed_credentials() -> frozenset[str]:
    """The credential headers ``OUTBOX_WRITER_HEADERS_ALLOWED`` lets writers set."""
    return frozenset(name.lower() for name in outbox_settings.WRITER_HEADERS_ALLOWED) & CREDENTIALS


def reserved_because(name: str, allowed: frozenset[str]) -> str | None:
    """Why a writer may not set the header `name`, or None when it may; `allowed`: the
    credentials it may set (`allowed_credentials`)."""
    lowered = name.lower()
    if lowered.startswith(RELAY_PREFIX):
        return f"{RELAY_PREFIX}* headers are the relays' own"
    if lowered in allowed:
        return None
    return RESERVED.get(lowered)


def check_writer_header(name: str, value: str, allowed: frozenset[str]) -> None:
    """Raise InvalidOutboxMessage, naming the header and the rule, if a writer may not
    set header `name` to `value`; `allowed`: as for `reserved_because`."""
    if not is_token(name):
        raise InvalidOutboxMessage(
            f"header name {name!r} is not an HTTP token: use letters, digits and "
            "!#$%&'*+-.^_`|~ only (no spaces, colons or control characters)."
        )
    reason = reserved_because(name, allowed)
    if reason is not None:
        raise InvalidOutboxMessage(
            f"header {name!r} is reserved ({reason}): a writer may not set it. "
            "Pick another name (an x- prefix, say); see the Security page of the docs."
        )
    character = control_character(value)
    if character is not None:
        raise InvalidOutboxMessage(
            f"header {name!r} has a control character ({character!r}) in its value: "
            "headers travel as HTTP and broker headers, which cannot carry it."
        )


def writer_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The writer's headers a relay sends: those the rule above lets a writer set (a row
    written before the rule may hold others)."""
    if not headers:
        return {}
    allowed = allowed_credentials()
    return {
        name: value
        for name, value in headers.items()
        if is_token(name)
        and reserved_because(name, allowed) is None
        and control_character(value) is None
    }
