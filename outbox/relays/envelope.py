"""What a relay puts on the wire for one message: a CloudEvents 1.0 event (structured,
the whole event as a JSON body; or binary, the attributes as headers and the payload as
the body) or the bare payload.

CloudEvents attributes: ``id`` = the message id, ``type`` = the category's name in lower
case (after an optional prefix, e.g. ``com.example.``), ``source`` (a URI reference;
``/outbox/<scope>`` unless given), ``subject`` = the object identifier, ``time`` = when the
message was written, ``datacontenttype`` = ``application/json``, and the trace context
as the ``traceparent`` / ``tracestate`` extensions when the message carries it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.serializers.json import DjangoJSONEncoder

from outbox.exceptions import OutboxConfigurationError

if TYPE_CHECKING:
    from outbox.relays.message import Message

__all__ = ["Bare", "CloudEvents", "Envelope", "envelope_named"]

TRACE_HEADERS = ("traceparent", "tracestate")


class Envelope:
    """How a message becomes a body and headers. `binary` says whether the CloudEvents
    attributes travel as headers (each relay names them its protocol's way)."""

    binary = False
    content_type = "application/json"

    def body(self, message: Message) -> bytes:
        raise NotImplementedError

    def attributes(self, message: Message) -> dict[str, str]:
        """Attributes sent as headers (binary mode); empty for a structured body."""
        return {}


class CloudEvents(Envelope):
    """A CloudEvents 1.0 event: structured (one JSON document, content type
    ``application/cloudevents+json``) unless `binary`."""

    def __init__(
        self, *, binary: bool = False, source: str | None = None, type_prefix: str = ""
    ) -> None:
        self.binary = binary
        self.source = source
        self.type_prefix = type_prefix
        self.content_type = "application/json" if binary else "application/cloudevents+json"

    def event(self, message: Message) -> dict[str, Any]:
        """The event's context attributes, without its data."""
        event = {
            "specversion": "1.0",
            "id": str(message.message_id),
            "source": self.source or f"/outbox/{message.scope.name.lower()}",
            "type": f"{self.type_prefix}{message.category.name.lower()}",
            "subject": str(message.object_identifier),
            "time": message.time.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "datacontenttype": "application/json",
        }
        for name in TRACE_HEADERS:
            if message.headers.get(name):
                event[name] = message.headers[name]
        return event

    def body(self, message: Message) -> bytes:
        if self.binary:
            return _json(message.payload)
        return _json({**self.event(message), "data": message.payload})

    def attributes(self, message: Message) -> dict[str, str]:
        if not self.binary:
            return {}
        attributes = self.event(message)
        del attributes["datacontenttype"]  # the protocol's content type says it
        return attributes


class Bare(Envelope):
    """The payload alone, as JSON; the message id and trace context go in the relay's
    headers (`Message.relay_headers`)."""

    def body(self, message: Message) -> bytes:
        return _json(message.payload)


def _json(value: Any) -> bytes:
    return json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":")).encode()


def envelope_named(name: str) -> Envelope:
    """``"cloudevents"`` (structured), ``"cloudevents-binary"`` or ``"bare"``."""
    if name == "cloudevents":
        return CloudEvents()
    if name == "cloudevents-binary":
        return CloudEvents(binary=True)
    if name == "bare":
        return Bare()
    raise OutboxConfigurationError(
        f"Unknown envelope {name!r}: use 'cloudevents', 'cloudevents-binary' or 'bare', "
        f"or an outbox.relays.envelope.Envelope instance (e.g. CloudEvents(source=...))."
    )
