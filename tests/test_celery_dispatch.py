"""The scheduler and drain tasks in-process, on every database: which shards go where.

(tests/test_celery.py runs the same with real workers, beat and a broker.)
"""

import time

import pytest
from django.db import transaction

from outbox import outbox_context
from outbox.engine import Drainer
from outbox.integrations import dispatch
from outbox.integrations.dispatch import DrainOrder, plan_drains, run_order
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.shards import ShardKey
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory

pytestmark = committing

prompted = []


def capture_prompt(using, shards):
    """An OUTBOX_PROMPT_DRAIN hook for the tests below."""
    prompted.append((using, {model: set(keys) for model, keys in shards.items()}))


@pytest.fixture
def prompt_hook(settings):
    settings.OUTBOX_PROMPT_DRAIN = "tests.test_celery_dispatch.capture_prompt"
    prompted.clear()
    yield prompted
    prompted.clear()


def region_key(identifier):
    return ShardKey("", 0, identifier)


def hold_elsewhere(identifier):
    """Another worker holds this shard of RegionOutbox (it must have a due row)."""
    lease = Drainer(RegionOutbox, identifiers=[identifier]).reserve(10, "elsewhere")
    assert lease.shards == [region_key(identifier)]


def test_scheduler_reserves_due_shards_in_orders_and_never_twice(settings):
    settings.OUTBOX_TASK_SHARDS = 2
    for shard in range(5):
        RegionOutboxFactory(shard_identifier=shard)
    orders = plan_drains([RegionOutbox])
    assert [order.shards for order in orders] == [
        [region_key(0), region_key(1)],
        [region_key(2), region_key(3)],
        [region_key(4)],
    ]
    assert len({order.reservation for order in orders}) == 1
    reserved = ShardLease.objects.filter(token=orders[0].reservation)
    assert reserved.count() == 5
    assert all(lease.holder.startswith("queued:") for lease in reserved)
    # The next tick finds nothing: the shards are reserved for the queued tasks.
    assert plan_drains([RegionOutbox]) == []


def test_scheduler_skips_leased_and_backing_off_shards(calls, settings):
    RegionOutboxFactory(shard_identifier=1)
    RegionOutboxFactory(shard_identifier=2)
    RegionOutboxFactory(shard_identifier=3)
    hold_elsewhere(1)
    calls.failing = {2}
    Drainer(RegionOutbox).drain_shards([region_key(2)])  # fails: shard 2 backs off
    [order] = plan_drains([RegionOutbox])
    assert order.shards == [region_key(3)]


def test_scheduler_keeps_in_flight_shards_under_the_limit(settings):
    settings.OUTBOX_TASK_SHARDS = 2
    settings.OUTBOX_CELERY_MAX_TASKS = 3
    for shard in range(10):
        RegionOutboxFactory(shard_identifier=shard)
    first = plan_drains([RegionOutbox])
    assert sum(len(order.shards) for order in first) == 6
    assert plan_drains([RegionOutbox]) == []  # all 6 still in flight
    for order in first[:2]:
        run_order(order)
    second = plan_drains([RegionOutbox])
    assert [key.shard_identifier for order in second for key in order.shards] == [6, 7, 8, 9]


def test_scheduler_interleaves_tables():
    for shard in range(3):
        RegionOutboxFactory(shard_identifier=shard)
        ControlOutboxFactory(shard_identifier=shard)
    orders = plan_drains([RegionOutbox, ControlOutbox])
    assert [order.table for order in orders] == ["outbox.RegionOutbox", "outbox.ControlOutbox"]
    assert [order.using for order in orders] == ["default", "control"]


def test_drain_order_releases_its_reservation_and_drains(calls):
    for n in range(3):
        RegionOutboxFactory(shard_identifier=n % 2, object_identifier=n)
    [order] = plan_drains([RegionOutbox])
    stats = run_order(DrainOrder.from_args(*order.as_args()))
    assert (stats.shards, stats.receiver_calls) == (2, 3)
    assert not RegionOutbox.objects.exists()
    assert not ShardLease.objects.exists()


def test_drain_order_leaves_a_shard_someone_else_holds(calls):
    RegionOutboxFactory(shard_identifier=1)
    hold_elsewhere(1)
    stats = run_order(DrainOrder("outbox.RegionOutbox", "default", [region_key(1)]))
    assert stats.receiver_calls == 0 and RegionOutbox.objects.count() == 1


def test_drain_order_stops_at_its_time_budget(calls, settings):
    settings.OUTBOX_TASK_SECONDS = 0.3
    calls.delay = 0.1
    for n in range(20):
        RegionOutboxFactory(shard_identifier=1, object_identifier=n)
    started = time.monotonic()
    stats = run_order(DrainOrder("outbox.RegionOutbox", "default", [region_key(1)]))
    assert time.monotonic() - started < 1.5
    assert 1 <= stats.receiver_calls < 20
    assert not ShardLease.objects.held().exists()  # released


def test_celery_drain_task_runs_an_order(calls):
    from outbox.integrations.celery import drain_task, schedule_drains_task

    RegionOutboxFactory(shard_identifier=1)
    [order] = plan_drains([RegionOutbox])
    result = drain_task.apply(args=order.as_args()).get()
    assert result["receiver_calls"] == 1
    assert not RegionOutbox.objects.exists()
    assert schedule_drains_task.name == "outbox.schedule_drains"


def test_prompt_hook_gets_the_shards_of_a_commit_once(prompt_hook):
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(shard_identifier=1)
        RegionOutboxFactory(shard_identifier=2)
        RegionOutboxFactory(shard_identifier=1)
        assert prompt_hook == []  # not before the commit
    assert prompt_hook == [("default", {RegionOutbox: {region_key(1), region_key(2)}})]


def test_prompt_hook_skips_rollbacks_and_flushed_writes(prompt_hook, calls):
    with pytest.raises(RuntimeError), outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(shard_identifier=1)
        raise RuntimeError("rolled back")
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(shard_identifier=2)  # flushed synchronously instead
    assert prompt_hook == []
    assert len(calls.calls) == 1


def test_prompt_hook_sees_writes_outside_any_context(prompt_hook):
    ControlOutboxFactory(shard_identifier=7)
    assert prompt_hook == [("control", {ControlOutbox: {ShardKey("us", 1, 7)}})]


def test_failing_prompt_hook_is_logged_not_raised(settings, caplog):
    settings.OUTBOX_PROMPT_DRAIN = "tests.test_celery_dispatch.no_such_hook"
    with outbox_context(transaction.atomic(), flush=False):
        RegionOutboxFactory(shard_identifier=1)
    assert RegionOutbox.objects.count() == 1
    assert "prompt drain failed" in caplog.text


def test_celery_tasks_take_their_names_from_the_settings_when_registered(settings):
    from celery import Celery

    from outbox.integrations.celery import add_beat_schedule

    settings.OUTBOX_CELERY_DRAIN_TASK = "custom.drain"
    settings.OUTBOX_CELERY_SCHEDULE_TASK = "custom.schedule"
    app = Celery("names", set_as_current=False)
    add_beat_schedule(app)
    assert {"custom.drain", "custom.schedule"} <= set(app.tasks)
    assert app.conf.beat_schedule["outbox-schedule-drains"]["task"] == "custom.schedule"


def test_celery_send_passes_the_time_limit(settings, monkeypatch):
    from outbox.integrations import celery

    settings.OUTBOX_CELERY_TIME_LIMIT_SECONDS = 12.0
    sent = []
    monkeypatch.setattr(celery.drain_task, "apply_async", lambda **options: sent.append(options))
    celery.send(DrainOrder("outbox.RegionOutbox", "default", [region_key(1)]))
    assert sent[0]["time_limit"] == 12.0


def test_dispatch_summary_is_json_friendly():
    stats = dispatch.DrainStats(shards=1, receiver_calls=2, rows_retired=3, seconds=0.12345)
    assert dispatch.stats_summary(stats)["seconds"] == 0.123
