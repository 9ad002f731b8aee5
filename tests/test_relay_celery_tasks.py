"""CeleryTaskRelay with a real Celery worker process (one pool process, concurrency 1)
on the Redis broker: the worker runs `tests.relayed` (tests/celery_app.py), which appends
what it was called with to a file. Messages are written in outbox_context and drained by
the real engine in the test process."""

import json
import os
import time
import uuid
from collections import defaultdict

import pytest
from django.conf import settings
from django.db import transaction

from outbox import outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import ControlOutbox, RegionOutbox
from outbox.relays import CeleryTaskRelay
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.relay_helpers import make_due
from tests.relay_helpers import messages as relay_messages
from tests.testapp.categories import Category
from tests.workers import ROOT, celery_worker, wait_until

celery = pytest.importorskip("celery")
redis = pytest.importorskip("redis")

pytestmark = committing

# The tests that start a worker run where the suite's other Celery tests run: its
# process reaches the database only there (tests/test_celery.py).
needs_worker = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    reason="the Celery tests run on PostgreSQL",
)


@pytest.fixture(scope="module")
def queue():
    """A queue of this module's own on the Redis broker (removed at the end)."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {settings.CELERY_BROKER_URL} is required in CI: {exc}")
        pytest.skip(f"Redis at {settings.CELERY_BROKER_URL} is unreachable: {exc}")
    name = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-relay-{uuid.uuid4().hex[:10]}"
    yield name
    for key in client.scan_iter(f"*{name}*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def worker(queue, tmp_path_factory):
    """One Celery worker of one pool process for the module; yields the file its task
    writes to."""
    directory = tmp_path_factory.mktemp("relayed")
    relayed = directory / "relayed.jsonl"
    relayed.touch()
    env = os.environ.copy()
    env["OUTBOX_TEST_RELAYED_FILE"] = str(relayed)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    process = celery_worker("relay", queue, directory, env, concurrency=1)
    yield relayed
    process.stop()


@pytest.fixture
def relayed(worker):
    """The calls the worker's task received during this test, as read so far."""
    worker.write_text("")

    def read() -> list[dict]:
        return [json.loads(line) for line in worker.read_text().splitlines() if line]

    return read


@pytest.fixture
def app():
    from tests.celery_app import app

    return app


@pytest.fixture
def relays():
    made = []
    yield made
    for relay in made:
        relay.disconnect()


def task_relay(relays, *targets, **options):
    relay = CeleryTaskRelay(f"task-{uuid.uuid4().hex[:8]}", task="tests.relayed", **options)
    relays.append(relay)
    return relay.connect(*targets)


@needs_worker
def test_every_message_arrives_once_with_its_id_in_order_per_shard(app, queue, relayed, relays):
    task_relay(relays, Category.AUDIT_EVENT, app=app, queue=queue)
    rows = []
    for round_ in range(6):
        with outbox_context(transaction.atomic(), flush=False):
            rows.extend(
                RegionOutboxFactory(
                    shard_identifier=shard,
                    object_identifier=shard * 100 + round_,
                    payload={"round": round_},
                )
                for shard in range(5)
            )
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    wait_until(lambda: len(relayed()) >= 30, timeout=30, message="tasks not all run")
    time.sleep(0.5)  # and no more come
    calls = relayed()
    assert sorted(call["task_id"] for call in calls) == sorted(str(row.message_id) for row in rows)
    by_shard = defaultdict(list)
    for call in calls:
        assert call["task_id"] == call["kwargs"]["message_id"]
        by_shard[call["kwargs"]["shard_identifier"]].append(call["kwargs"]["object_identifier"])
    assert by_shard == {shard: [shard * 100 + n for n in range(6)] for shard in range(5)}

    row = rows[7]
    [call] = [call for call in calls if call["task_id"] == str(row.message_id)]
    assert call["kwargs"] == {
        "message_id": str(row.message_id),
        "category": "AUDIT_EVENT",
        "shard_scope": "ORGANIZATION",
        "shard_identifier": row.shard_identifier,
        "region_name": None,
        "object_identifier": row.object_identifier,
        "payload": row.payload,
        "attempt": 1,
        "headers": {},
        "time": call["kwargs"]["time"],
    }
    assert call["kwargs"]["time"].startswith(row.date_added.strftime("%Y-%m-%dT%H:%M"))
    assert {
        name: value for name, value in call["headers"].items() if name.startswith("outbox-")
    } == {
        "outbox-message-id": str(row.message_id),
        "outbox-category": "AUDIT_EVENT",
        "outbox-shard": f"ORGANIZATION:{row.shard_identifier}",
        "outbox-attempt": "1",
    }


@needs_worker
def test_the_writers_headers_and_a_control_message_on_the_current_app(app, relayed, relays, queue):
    app.set_current()
    task_relay(relays, Category.USER_UPDATE, queue=queue)  # app=None: the current app
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with outbox_context(transaction.atomic(using="control"), flush=True):
        row = ControlOutboxFactory(shard_identifier=3, headers={"traceparent": traceparent})
    assert not ControlOutbox.objects.exists()
    wait_until(lambda: relayed(), timeout=30, message="task not run")
    [call] = relayed()
    assert call["kwargs"]["region_name"] == "us"
    assert call["kwargs"]["shard_scope"] == "USER"
    assert call["kwargs"]["headers"] == {"traceparent": traceparent}
    assert call["headers"]["traceparent"] == traceparent
    assert call["headers"]["outbox-shard"] == "USER:3:us"
    assert call["task_id"] == str(row.message_id)


@needs_worker
def test_a_broker_that_refuses_fails_the_message_and_the_retry_keeps_its_id(
    app, queue, relayed, relays, calls
):
    refusing = celery.Celery(
        "refusing", broker="redis://127.0.0.1:9/0", set_as_current=False
    )  # nothing listens on port 9
    refusing.conf.broker_connection_timeout = 1
    relay = task_relay(relays, Category.AUDIT_EVENT, app=refusing, queue=queue)
    row = RegionOutboxFactory(shard_identifier=1)
    started = time.monotonic()
    drain_outboxes()
    assert time.monotonic() - started < 20
    failed = RegionOutbox.objects.get()
    assert failed.attempts == 1
    assert "Connection refused" in failed.last_error or "Error 111" in failed.last_error
    assert len(calls.calls) == 1  # the category's other receiver went on

    relay.app = app  # the broker is back
    make_due()
    drain_outboxes()
    assert not RegionOutbox.objects.exists()
    wait_until(lambda: relayed(), timeout=30, message="task not run")
    [call] = relayed()
    assert call["task_id"] == str(row.message_id)
    assert call["kwargs"]["attempt"] == 2
    assert len(calls.calls) == 1


@needs_worker
def test_a_batch_stops_a_refused_shard_only(app, queue, relayed, relays):

    relay = CeleryTaskRelay("batch", task="tests.relayed", app=app, queue=queue)
    # A payload Celery's JSON serializer refuses stops shard 1 at its second.
    messages = relay_messages(
        3, 3, first_shard=0, payload=lambda shard, n: object() if (shard, n) == (1, 1) else {"n": n}
    )
    failed = relay.publish(messages)
    refused = [m.message_id for m in messages if m.shard_identifier == 1 and m.object_identifier]
    assert set(failed) == set(refused)
    wait_until(lambda: len(relayed()) >= 7, timeout=30, message="tasks not all run")
    time.sleep(0.5)
    sent = [(c["kwargs"]["shard_identifier"], c["kwargs"]["object_identifier"]) for c in relayed()]
    assert sent == [
        (shard, n) for n in range(3) for shard in range(3) if (shard, n) not in {(1, 1), (1, 2)}
    ]


def test_checks():
    assert CeleryTaskRelay("ok", task="billing.sync").check() == []
    errors = CeleryTaskRelay("bad", task="", queue="", options={"task_id": "x"}).check()
    assert [error.id for error in errors] == ["outbox.E023"] * 3
    assert [error.msg for error in errors] == [
        "Relay 'bad': task must be a task's name (a non-empty str), not ''",
        "Relay 'bad': queue must be a queue's name or None, not ''",
        "Relay 'bad': options may not set ['task_id']: the relay sets them per message",
    ]
    assert CeleryTaskRelay("fine", task="t", options={"priority": 3}).check() == []


def test_without_celery_the_relay_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "celery", None)
    with pytest.raises(OutboxConfigurationError, match=r'pip install "django-outboxes\[celery\]"'):
        CeleryTaskRelay("no-client", task="x")
