"""Trace context from the writer to the receivers, with the OpenTelemetry SDK's in-memory
exporter: the writer's span and the `outbox.deliver` span are one trace, through the
synchronous flush and through the drain."""

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.factories import RegionOutboxFactory
from tests.testapp.categories import Category

pytestmark = committing

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The global tracer provider (set once per process, as OpenTelemetry allows),
    exporting to memory; emptied for each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def tracer():
    return trace.get_tracer("tests.writer")


def delivered(exporter):
    return [span for span in exporter.get_finished_spans() if span.name == "outbox.deliver"]


def test_the_drain_delivers_in_the_writers_trace(spans, calls):
    with (
        tracer().start_as_current_span("POST /orgs") as request,
        outbox_context(transaction.atomic(), flush=False),
    ):
        row = RegionOutboxFactory(
            shard_identifier=5, object_identifier=9, category=Category.ORGANIZATION_UPDATE
        )
    writer = request.get_span_context()
    stored = RegionOutbox.objects.get().headers
    assert stored["traceparent"] == (
        f"00-{writer.trace_id:032x}-{writer.span_id:016x}-{writer.trace_flags:02x}"
    )
    drain_outboxes()  # later, outside the request's span
    (deliver,) = delivered(spans)
    assert deliver.context.trace_id == writer.trace_id
    assert deliver.parent.span_id == writer.span_id
    assert deliver.kind is SpanKind.CONSUMER
    assert deliver.attributes["messaging.message.id"] == str(row.message_id)
    assert deliver.attributes["outbox.shard_identifier"] == 5
    assert deliver.attributes["outbox.attempt"] == 1
    assert deliver.attributes["messaging.destination.name"] == "ORGANIZATION_UPDATE"
    # The receiver runs inside the span, and gets the context to forward by hand.
    assert calls.calls[0]["headers"]["traceparent"] == stored["traceparent"]


def test_the_flush_delivers_in_the_writers_trace(spans, calls):
    seen = []
    calls.during_call = lambda sender, kwargs: seen.append(trace.get_current_span())
    with (
        tracer().start_as_current_span("POST /orgs") as request,
        outbox_context(transaction.atomic(), flush=True),
    ):
        RegionOutboxFactory(shard_identifier=5)
    (deliver,) = delivered(spans)
    assert deliver.context.trace_id == request.get_span_context().trace_id
    assert deliver.parent.span_id == request.get_span_context().span_id
    assert seen[0].get_span_context().span_id == deliver.context.span_id  # current in the call
    assert not RegionOutbox.objects.exists()


def test_a_failed_delivery_is_an_error_span(spans, calls):
    calls.failing.add(5)
    with tracer().start_as_current_span("POST /orgs"):
        RegionOutboxFactory(shard_identifier=5)
    drain_outboxes()
    (deliver,) = delivered(spans)
    assert deliver.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in deliver.events)


def test_without_a_current_span_nothing_is_stored_and_the_delivery_is_a_root(spans, calls):
    RegionOutboxFactory(shard_identifier=5, headers={"tenant": "acme"})
    assert RegionOutbox.objects.get().headers == {"tenant": "acme"}
    drain_outboxes()
    (deliver,) = delivered(spans)
    assert deliver.parent is None


def test_a_writers_own_traceparent_is_kept(spans, calls):
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer().start_as_current_span("POST /orgs"):
        RegionOutboxFactory(shard_identifier=5, headers={"traceparent": own})
    assert RegionOutbox.objects.get().headers == {"traceparent": own}
    drain_outboxes()
    (deliver,) = delivered(spans)
    assert f"{deliver.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
