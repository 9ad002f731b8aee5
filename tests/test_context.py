"""outbox_context: flush after commit, on the right database, never after a rollback."""

import dataclasses
import logging
import threading

import pytest
from django.db import transaction
from django.test import override_settings

from outbox import outbox_context
from outbox.exceptions import OutboxContextRequired, OutboxError
from outbox.models import ControlOutbox, RegionOutbox
from outbox.writes import context
from outbox.writes.context import _current
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing


def test_commit_flushes_after_commit_and_not_before(calls):
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(payload={"v": 1})
        assert calls.calls == []
    assert calls.payloads() == [{"v": 1}]
    assert not RegionOutbox.objects.exists()


def test_rollback_leaves_no_row_and_flushes_nothing(calls):
    with pytest.raises(ZeroDivisionError), outbox_context(transaction.atomic()):
        RegionOutboxFactory()
        raise ZeroDivisionError
    assert not RegionOutbox.objects.exists()
    assert calls.calls == []


def test_rolled_back_savepoint_keeps_the_rest_flushing(calls):
    with outbox_context(transaction.atomic()):
        try:
            with transaction.atomic():
                RegionOutboxFactory(shard_identifier=1, payload={"v": "gone"})
                raise ZeroDivisionError
        except ZeroDivisionError:
            pass
        RegionOutboxFactory(shard_identifier=2, payload={"v": "kept"})
    assert calls.payloads() == [{"v": "kept"}]
    assert not RegionOutbox.objects.exists()


def test_flush_false_leaves_rows_for_the_drain(calls):
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory()
    assert calls.calls == []
    assert RegionOutbox.objects.count() == 1


def test_nested_contexts_inherit_and_restore(calls):
    with outbox_context(transaction.atomic()):
        assert _current.get().flush is True
        with outbox_context(flush=False):
            assert _current.get().flush is False
            with outbox_context():
                assert _current.get().flush is False  # inherited
            RegionOutboxFactory(shard_identifier=1)
        assert _current.get().flush is True
        RegionOutboxFactory(shard_identifier=2)
    assert _current.get() is None
    assert [c["shard_identifier"] for c in calls.calls] == [2]
    assert list(RegionOutbox.objects.values_list("shard_identifier", flat=True)) == [1]


def test_flushing_without_a_transaction_is_refused():
    with pytest.raises(OutboxError, match="needs a transaction"), outbox_context():
        pass


def test_inner_context_may_flush_with_the_outer_transaction(calls):
    with outbox_context(transaction.atomic()), outbox_context(flush=True):
        RegionOutboxFactory(payload={"v": "inner"})
    assert calls.payloads() == [{"v": "inner"}]


def test_flush_runs_on_the_rows_own_database(calls):
    # The control transaction is still open when the region row (default database,
    # autocommit) is written: it is flushed at once; the control row waits for its commit.
    with outbox_context(transaction.atomic(using="control")):
        ControlOutboxFactory(payload={"side": "control"})
        RegionOutboxFactory(payload={"side": "region"})
        assert calls.payloads() == [{"side": "region"}]
    assert calls.payloads() == [{"side": "region"}, {"side": "control"}]
    assert not ControlOutbox.objects.exists()


def test_control_rollback_does_not_touch_committed_region_rows(calls):
    with pytest.raises(ZeroDivisionError), outbox_context(transaction.atomic(using="control")):
        ControlOutboxFactory()
        with outbox_context(transaction.atomic(using="default"), flush=False):
            RegionOutboxFactory()
        raise ZeroDivisionError
    assert not ControlOutbox.objects.exists()
    assert RegionOutbox.objects.count() == 1


def test_contexts_are_private_to_each_thread(calls):
    seen = {}

    def other_thread():
        seen["frame"] = _current.get()

    with outbox_context(flush=False):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen["frame"] is None


def test_flush_is_bounded_to_rows_that_existed_at_commit(calls):
    def write_another_row(sender, kwargs):
        if kwargs["payload"] == {"v": "first"}:
            RegionOutboxFactory(shard_identifier=1, payload={"v": "later"})

    calls.during_call = write_another_row
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=1, payload={"v": "first"})
    assert calls.payloads() == [{"v": "first"}]
    assert list(RegionOutbox.objects.values_list("payload", flat=True)) == [{"v": "later"}]


def test_failing_flush_is_logged_and_left_for_the_drain(calls, caplog):
    calls.failing = {7}
    with caplog.at_level(logging.WARNING, logger="outbox"), outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=7)
    row = RegionOutbox.objects.get()
    assert row.attempts == 1
    assert "receiver failed for shard 7" in row.last_error
    assert any("shard ORGANIZATION/7" in message for message in caplog.messages)


@override_settings(OUTBOX_FLUSH_STRICT=True)
def test_strict_flush_reraises_after_commit(calls, monkeypatch):
    calls.failing = {7}

    def raising_flush(using, bounds):
        raise RuntimeError("flush broke")

    above = context.layers_above()
    monkeypatch.setattr(context, "_above", dataclasses.replace(above, flush=raising_flush))
    with pytest.raises(RuntimeError, match="flush broke"), outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=7)
    assert RegionOutbox.objects.count() == 1  # committed before the flush failed


@override_settings(OUTBOX_REQUIRE_CONTEXT=True)
def test_strict_mode_refuses_saves_outside_a_context():
    with pytest.raises(OutboxContextRequired):
        RegionOutboxFactory()
    with pytest.raises(OutboxContextRequired):
        RegionOutbox.objects.bulk_create([RegionOutboxFactory.build()])
    assert not RegionOutbox.objects.exists()
    with outbox_context(flush=False):
        RegionOutboxFactory()
    assert RegionOutbox.objects.count() == 1


def test_contexts_are_private_to_each_asyncio_task():
    import asyncio

    async def inside_context(entered, release):
        with outbox_context(flush=False):
            entered.set()
            await release.wait()
            return _current.get().flush

    async def outside(entered, release):
        await entered.wait()
        frame = _current.get()
        release.set()
        return frame

    async def main():
        entered, release = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(inside_context(entered, release), outside(entered, release))

    assert asyncio.run(main()) == [False, None]
