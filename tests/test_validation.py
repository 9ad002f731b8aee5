"""Bad input gives a clear error, leaves the caller's transaction usable, writes nothing."""

import datetime
import decimal
import enum
import functools

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.test import override_settings
from django.test.utils import isolate_apps

from outbox import OutboxCategory, OutboxScope, outbox_context
from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage, OutboxConfigurationError
from outbox.models import ControlOutbox, OutboxBase, RegionOutbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category, Scope

pytestmark = committing


class Opaque:
    pass


BAD_REGION_ROWS = [
    pytest.param({"payload": {1, 2}}, "not JSON-serialisable", id="set"),
    pytest.param({"payload": b"bytes"}, "not JSON-serialisable", id="bytes"),
    pytest.param({"payload": {"x": Opaque()}}, "not JSON-serialisable", id="object"),
    pytest.param({"payload": {"x": float("nan")}}, "not JSON-serialisable", id="nan"),
    pytest.param({"payload": [float("inf")]}, "not JSON-serialisable", id="infinity"),
    pytest.param(
        {"category": Category.USER_UPDATE},
        "Category.USER_UPDATE belongs to scope Scope.USER, not to Scope.ORGANIZATION",
        id="category-outside-scope",
    ),
    pytest.param({"category": 999}, "Unknown category 999", id="unknown-category"),
    pytest.param({"shard_scope": 77}, "Unknown shard_scope 77", id="unknown-scope"),
    pytest.param({"shard_identifier": 2**63}, "does not fit", id="identifier-too-big"),
    pytest.param({"object_identifier": -(2**63) - 1}, "does not fit", id="identifier-too-small"),
    pytest.param({"object_identifier": "12"}, "must be an integer", id="identifier-not-int"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_REGION_ROWS)
def test_bad_row_is_refused_and_the_transaction_stays_usable(fields, message):
    with outbox_context(transaction.atomic()):
        with pytest.raises(InvalidOutboxMessage, match=message):
            RegionOutboxFactory(**fields)
        RegionOutboxFactory(shard_identifier=99, payload={"still": "usable"})
        transaction.set_rollback(True)  # keep the flush out of this test
    assert not RegionOutbox.objects.exists()
    with outbox_context(transaction.atomic(), flush=False):
        with pytest.raises(InvalidOutboxMessage, match=message):
            RegionOutboxFactory(**fields)
        RegionOutboxFactory(shard_identifier=99)
    assert list(RegionOutbox.objects.values_list("shard_identifier", flat=True)) == [99]


@pytest.mark.parametrize("region_name", [None, "", "   "])
def test_control_row_needs_a_region(region_name):
    with pytest.raises(InvalidOutboxMessage, match="region_name"):
        ControlOutboxFactory(region_name=region_name)
    assert not ControlOutbox.objects.exists()


@override_settings(OUTBOX_MAX_PAYLOAD_BYTES=100)
@pytest.mark.parametrize(
    "payload",
    [
        {1, 2},
        {"text": "x" * 200},
        ["\ud800"],
        functools.reduce(lambda inner, _: [inner], range(31), []),
    ],
    ids=["not-json", "too-big", "lone-surrogate", "too-deep"],
)
def test_a_refused_payload_names_its_category_as_declared(payload):
    # Written with the stored integer, as a row read back or a raw write has it.
    with pytest.raises(InvalidOutboxMessage) as refused:
        RegionOutboxFactory(category=1, payload=payload)
    assert str(refused.value).startswith("payload of category ORGANIZATION_UPDATE ")
    assert not RegionOutbox.objects.exists()


@override_settings(OUTBOX_MAX_PAYLOAD_BYTES=100)
def test_payload_over_the_size_limit():
    with pytest.raises(InvalidOutboxMessage, match="over OUTBOX_MAX_PAYLOAD_BYTES=100"):
        RegionOutboxFactory(payload={"text": "x" * 200})
    RegionOutboxFactory(payload={"text": "x" * 50})
    assert RegionOutbox.objects.count() == 1


def test_bulk_create_validates_every_row_and_writes_none_on_error():
    rows = [RegionOutboxFactory.build(), RegionOutboxFactory.build(payload={1})]
    with pytest.raises(InvalidOutboxMessage):
        RegionOutbox.objects.bulk_create(rows)
    assert not RegionOutbox.objects.exists()


@pytest.mark.usefixtures("scratch_registry")
def test_category_in_two_scopes_fails_at_import_naming_both():
    class Extra(OutboxCategory):
        SHARED = 901

    with pytest.raises(OutboxConfigurationError, match=r"Extra.SHARED .*Left.A and Right.B"):

        class Left(OutboxScope):
            A = 900, {Extra.SHARED}

        class Right(OutboxScope):
            B = 901, {Extra.SHARED}


@pytest.mark.usefixtures("scratch_registry")
def test_scope_must_list_category_members():
    class NotACategory(enum.IntEnum):
        X = 950

    with pytest.raises(OutboxConfigurationError, match="not an OutboxCategory"):

        class Bad(OutboxScope):
            C = 950, {NotACategory.X}


def test_scope_lookup_by_name_and_value():
    assert registry.scope_by_name("organization") is Scope.ORGANIZATION
    assert registry.scope_by_name("1") is Scope.USER
    assert Category.USER_UPDATE.scope is Scope.USER


@isolate_apps("tests.testapp")
def test_a_payload_field_with_its_own_encoder_is_checked_and_written_with_it():
    """A concrete outbox table may give its payload a JSON encoder: validation encodes
    with it (a datetime or Decimal is then fine), and the row holds the encoded text."""

    class EncodedOutbox(OutboxBase):
        payload = models.JSONField(null=True, encoder=DjangoJSONEncoder)

        class Meta(OutboxBase.Meta):
            app_label = "testapp"

    with connection.schema_editor() as editor:
        editor.create_model(EncodedOutbox)
    try:
        at = datetime.datetime(2026, 11, 21, 12, 30, tzinfo=datetime.UTC)
        for defer in (True, False):
            with override_settings(OUTBOX_DEFER_WRITES=defer):
                with outbox_context(transaction.atomic(), flush=False):
                    row = EncodedOutbox(
                        shard_scope=Scope.ORGANIZATION,
                        shard_identifier=1,
                        category=Category.ORGANIZATION_UPDATE,
                        object_identifier=1,
                        payload={"at": at, "amount": decimal.Decimal("1.10")},
                    )
                    row.save()
                assert EncodedOutbox.objects.get(pk=row.pk).payload == {
                    "at": "2026-11-21T12:30:00Z",
                    "amount": "1.10",
                }
                EncodedOutbox.objects.all().delete()
        with pytest.raises(InvalidOutboxMessage, match="not JSON-serialisable") as raised:
            EncodedOutbox(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=1,
                category=Category.ORGANIZATION_UPDATE,
                object_identifier=1,
                payload={"x": Opaque()},
            ).save()
        assert "The encoder of EncodedOutbox.payload (DjangoJSONEncoder) cannot encode it" in (
            str(raised.value)
        )
    finally:
        with connection.schema_editor() as editor:
            editor.delete_model(EncodedOutbox)


@pytest.mark.parametrize(
    "value", [datetime.datetime(2026, 11, 21, tzinfo=datetime.UTC), decimal.Decimal("1.10")]
)
def test_a_value_json_lacks_names_the_encoder_option(value):
    """A datetime or Decimal in the payload: the error says how to convert it or which
    option encodes it (a table whose payload field has an encoder)."""
    with pytest.raises(InvalidOutboxMessage) as raised:
        RegionOutboxFactory(payload={"x": value})
    message = str(raised.value)
    assert f"Object of type {type(value).__name__} is not JSON serializable" in message
    assert "isoformat()" in message
    assert "payload = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)" in message
    assert "docs/howto/custom-table.md" in message
    assert not RegionOutbox.objects.exists()


@pytest.mark.parametrize("payload", [{"x": float("nan")}, {(1, 2): 3}])
def test_no_encoder_hint_where_an_encoder_would_not_help(payload):
    with pytest.raises(InvalidOutboxMessage, match="not JSON-serialisable") as raised:
        RegionOutboxFactory(payload=payload)
    assert "encoder" not in str(raised.value)
