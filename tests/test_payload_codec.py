"""A payload field with its own JSON encoder and decoder round-trips through the drain.

Receivers must see the payload as Django would load it from that model's payload field,
on every backend: the PostgreSQL fast path reads jsonb as text and decodes it itself.
"""

import datetime
import decimal
import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.test.utils import isolate_apps

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.models import OutboxBase
from tests.conftest import committing
from tests.testapp.categories import Category, Scope

pytestmark = committing


class TaggingEncoder(DjangoJSONEncoder):
    """Writes Decimals and dates as tagged objects, so they can be read back exactly."""

    def default(self, o: Any) -> Any:
        if isinstance(o, decimal.Decimal):
            return {"__decimal__": str(o)}
        if isinstance(o, datetime.date):
            return {"__date__": o.isoformat()}
        return super().default(o)


class TaggingDecoder(json.JSONDecoder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("object_hook", self.revive)
        super().__init__(*args, **kwargs)

    @staticmethod
    def revive(obj: dict[str, Any]) -> Any:
        if obj.keys() == {"__decimal__"}:
            return decimal.Decimal(obj["__decimal__"])
        if obj.keys() == {"__date__"}:
            return datetime.date.fromisoformat(obj["__date__"])
        return obj


@pytest.fixture
def codec_outbox():
    """A concrete outbox table whose payload has its own encoder and decoder."""
    with isolate_apps("tests.testapp"):

        class CodecOutbox(OutboxBase):
            payload = models.JSONField(null=True, encoder=TaggingEncoder, decoder=TaggingDecoder)

            class Meta(OutboxBase.Meta):
                app_label = "testapp"

        with connection.schema_editor() as editor:
            editor.create_model(CodecOutbox)
        try:
            yield CodecOutbox
        finally:
            with connection.schema_editor() as editor:
                editor.delete_model(CodecOutbox)


def write(model, object_identifier, payload, defer=False):
    with outbox_context(transaction.atomic(), flush=False, defer=defer):
        model(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=1,
            category=Category.ORGANIZATION_UPDATE,
            object_identifier=object_identifier,
            payload=payload,
        ).save()


@pytest.mark.parametrize("defer", [False, True], ids=["saved at once", "deferred writer"])
def test_receivers_get_the_payload_as_the_fields_decoder_reads_it(calls, codec_outbox, defer):
    payload = {
        "amount": decimal.Decimal("1.10"),
        "on": datetime.date(2026, 11, 21),
        "lines": [{"price": decimal.Decimal("0.30")}],
    }
    write(codec_outbox, 1, {"amount": decimal.Decimal("9.99")}, defer)  # coalesced away
    write(codec_outbox, 1, payload, defer)
    write(codec_outbox, 2, None, defer)
    # The table holds what the field's encoder wrote, on both write paths.
    stored = codec_outbox.objects.order_by("id").values_list("payload", flat=True)
    assert list(stored)[1] == payload
    stats = drain_outboxes([codec_outbox])
    assert (stats.receiver_calls, stats.rows_retired) == (2, 3)
    assert calls.payloads() == [payload, None]
    assert type(calls.payloads()[0]["amount"]) is decimal.Decimal
    assert not codec_outbox.objects.exists()
