"""A writer's headers (a correlation id, a tenant, a schema version) reach receivers as
the `headers` keyword argument, are checked like the payload, and coalesce to the
newest row's."""

import pytest
from django.db import transaction
from django.test import override_settings

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import ControlOutbox, RegionOutbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


def test_headers_reach_receivers_through_the_drain(calls):
    RegionOutboxFactory(shard_identifier=1, headers={"tenant": "acme", "schema": "2"})
    RegionOutboxFactory(shard_identifier=2)
    ControlOutboxFactory(shard_identifier=3, headers={"correlation-id": "ä-1"})
    drain_outboxes()
    by_shard = {call["shard_identifier"]: call["headers"] for call in calls.calls}
    assert by_shard == {1: {"tenant": "acme", "schema": "2"}, 2: {}, 3: {"correlation-id": "ä-1"}}


def test_headers_reach_receivers_through_the_flush(calls):
    with outbox_context(transaction.atomic(), flush=True):
        RegionOutboxFactory(shard_identifier=1, headers={"tenant": "acme"})
    assert [call["headers"] for call in calls.calls] == [{"tenant": "acme"}]
    assert not RegionOutbox.objects.exists()


def test_coalescing_keeps_the_newest_rows_headers(calls):
    for version in ("1", "2", "3"):
        RegionOutboxFactory(shard_identifier=1, object_identifier=1, headers={"v": version})
    RegionOutboxFactory(shard_identifier=2, object_identifier=2, headers={"v": "1"})
    RegionOutboxFactory(shard_identifier=2, object_identifier=2)  # the newest has none
    drain_outboxes()
    by_shard = {call["shard_identifier"]: call["headers"] for call in calls.calls}
    assert by_shard == {1: {"v": "3"}, 2: {}}


def test_held_rows_keep_their_headers_as_saved(calls):
    headers = {"tenant": "acme"}
    with outbox_context(transaction.atomic(), flush=False, defer=True):
        RegionOutboxFactory(shard_identifier=1, headers=headers)
        headers["tenant"] = "changed after save"
    assert RegionOutbox.objects.get().headers == {"tenant": "acme"}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        pytest.param(["a", "b"], "headers must be a dict", id="list"),
        pytest.param({"n": 1}, "header 'n' must have a str value, got int", id="int-value"),
        pytest.param({"n": {"x": "y"}}, "must have a str value, got dict", id="nested"),
        pytest.param({1: "x"}, "header name 1 is not a non-empty str", id="int-name"),
        pytest.param({"": "x"}, "header name '' is not a non-empty str", id="empty-name"),
        pytest.param({"n": "a\x00b"}, "contains a NUL character", id="nul"),
        pytest.param({"n": "\ud800"}, "lone surrogate", id="surrogate"),
    ],
)
def test_bad_headers_are_refused_and_nothing_is_written(headers, message):
    with outbox_context(transaction.atomic(), flush=False):
        with pytest.raises(InvalidOutboxMessage, match=message):
            RegionOutboxFactory(headers=headers)
        with pytest.raises(InvalidOutboxMessage, match=message):
            ControlOutbox.objects.bulk_create([ControlOutboxFactory.build(headers=headers)])
        RegionOutboxFactory(shard_identifier=99)  # the transaction is still usable
    assert list(RegionOutbox.objects.values_list("shard_identifier", flat=True)) == [99]
    assert not ControlOutbox.objects.exists()


@override_settings(OUTBOX_MAX_HEADERS_BYTES=20)
def test_headers_over_the_size_limit():
    with pytest.raises(InvalidOutboxMessage, match="21 bytes, over OUTBOX_MAX_HEADERS_BYTES=20"):
        RegionOutboxFactory(headers={"tenant": "x" * 15})
    RegionOutboxFactory(headers={"tenant": "x" * 14})  # 20 bytes: accepted
    assert RegionOutbox.objects.count() == 1
