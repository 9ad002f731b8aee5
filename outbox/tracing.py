"""Trace context from the writer to the receivers, where OpenTelemetry is installed.

A row written while a span is current carries that span's W3C trace context in its
headers (`traceparent`, and `tracestate` when set), unless the writer set a
`traceparent` of its own. Each delivery of a message to its receivers then runs in an
`outbox.deliver` span, a child of the writer's span, so the request that wrote the row
and the call that delivered it are one trace; a receiver's own instrumented calls (an
HTTP client, a broker) join it, and `headers` hands the context to code that forwards
it by hand.

Without `opentelemetry-api` nothing is stored and nothing runs; with it, a delivery
makes spans only once a tracer provider is set (the SDK configured), and a write stores
a context only when its span is valid (a recording span).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the API is an optional dependency
    trace = None  # type: ignore[assignment]

_propagator = TraceContextTextMapPropagator() if trace is not None else None


def with_trace_context(headers: Mapping[str, str] | None) -> Any:
    """`headers`, plus the current span's trace context when a valid span is current
    and the headers carry no `traceparent` yet (a new dict: the caller's is not
    changed)."""
    if _propagator is None or (headers and "traceparent" in headers):
        return headers
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier = dict(headers or {})
    _propagator.inject(carrier)
    return carrier


def delivery_tracer() -> Any:
    """The tracer for delivery spans, or None while no tracer provider is set (then a
    delivery makes no span at all)."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer("django-outboxes")


def delivery_span(
    tracer: Any, kwargs: Mapping[str, Any], category: Any
) -> AbstractContextManager[Any]:
    """The `outbox.deliver` span of one message's delivery (`kwargs`: the receivers'
    keyword arguments), a child of the writer's span when the message carries one."""
    headers = kwargs["headers"]
    parent = None
    if _propagator is not None and headers and "traceparent" in headers:
        parent = _propagator.extract(headers)
    attributes = {
        "messaging.system": "django-outboxes",
        "messaging.operation.type": "process",
        "messaging.message.id": str(kwargs["message_id"]),
        "messaging.destination.name": getattr(category, "name", str(category)),
        "outbox.shard_scope": int(kwargs["shard_scope"]),
        "outbox.shard_identifier": int(kwargs["shard_identifier"]),
        "outbox.object_identifier": int(kwargs["object_identifier"]),
        "outbox.attempt": kwargs["attempt"],
        "db.namespace": kwargs.get("using", ""),
    }
    if "region_name" in kwargs:
        attributes["outbox.region_name"] = kwargs["region_name"]
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        "outbox.deliver", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    )
