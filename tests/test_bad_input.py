"""The bad-input table (issue #5): one test per row, on every database.

Each bad input gets a clear error or its documented behaviour, leaves the caller's
transaction usable, and writes nothing half-way. Rows already covered elsewhere: sets,
bytes, objects, NaN, infinity, a category outside its scope, an unknown category or
scope, 64-bit overflow of the identifiers, a missing region_name outside a transaction
(tests/test_validation.py); a drain interrupted by KeyboardInterrupt (tests/test_engine.py);
strict mode outside any transaction, a receiver failing in the flush (tests/test_context.py).
"""

import contextlib
import logging
import re
import socket
import sqlite3
import time
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.db.utils import Error as DatabaseDriverError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox import OutboxCategory, OutboxScope, outbox_context
from outbox.engine import drain_outboxes
from outbox.exceptions import InvalidOutboxMessage, OutboxConfigurationError, OutboxContextRequired
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.signals import process_region_outbox
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.testapp.categories import Category
from tests.testapp.models import Ledger, Organization
from tests.testapp.receivers import record

pytestmark = committing


def nested(depth, leaf=1):
    """A payload of `depth` nested containers, arrays and objects in turn."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def circular():
    loop = []
    loop.append(loop)
    return loop


def assert_refused_before_any_sql(factory, fields, message, using):
    """Refused in a flushing and in a non-flushing context, with no statement sent; the
    transaction then takes other writes and commits them, and only them."""
    for flush in (True, False):
        with outbox_context(transaction.atomic(using=using), flush=flush):
            with (
                CaptureQueriesContext(connections[using]) as queries,
                pytest.raises(InvalidOutboxMessage, match=message),
            ):
                factory(**fields)
            assert queries.captured_queries == []
            Ledger.objects.using(using).create(entry=int(flush))
            good = ControlOutboxFactory if using == "control" else RegionOutboxFactory
            good(shard_identifier=99, payload={"fine": flush})
    assert sorted(Ledger.objects.using(using).values_list("entry", flat=True)) == [0, 1]
    # The flushing transaction's good row was delivered; the other waits for the drain.
    assert list(good._meta.model.objects.values_list("shard_identifier", "payload")) == [
        (99, {"fine": False})
    ]


# Rows refused by validation before any SQL (input, fields, error).
REFUSED_REGION_ROWS = [
    pytest.param(
        {"payload": {"text": "x" * 1_000_000}},
        "is 1000012 bytes, over OUTBOX_MAX_PAYLOAD_BYTES=1000000",
        id="payload-over-default-size-limit",
    ),
    pytest.param({"payload": {"x": "a\x00b"}}, "NUL character", id="payload-nul-in-string"),
    pytest.param({"payload": {"a\x00": 1}}, "NUL character", id="payload-nul-in-key"),
    pytest.param({"payload": ["\ud800"]}, "lone surrogate", id="payload-lone-high-surrogate"),
    pytest.param({"payload": "x\udfff"}, "lone surrogate", id="payload-lone-low-surrogate"),
    pytest.param({"payload": "\ude00\ud83d"}, "lone surrogate", id="payload-reversed-pair"),
    pytest.param({"payload": nested(32)}, "nested more than 31", id="payload-nested-32-deep"),
    pytest.param(
        {"payload": [[]] * 40 + [nested(31)]}, "nested more than 31", id="payload-deep-and-wide"
    ),
    pytest.param({"payload": nested(5000)}, "nested more than 31", id="payload-recursion-limit"),
    pytest.param({"payload": circular()}, "not JSON-serialisable", id="payload-circular"),
    pytest.param({"payload": {(1, 2): 3}}, "not JSON-serialisable", id="payload-tuple-key"),
    pytest.param({"payload": {"n": 10**5000}}, "not JSON-serialisable", id="payload-huge-int"),
    pytest.param({"payload": {"when": timezone.now()}}, "not JSON-serialisable", id="datetime"),
    pytest.param({"shard_scope": 2**31}, "shard_scope=2147483648 does not fit", id="scope-int32"),
    pytest.param({"category": -(2**31) - 1}, "category=-2147483649 does not fit", id="cat-int32"),
    pytest.param({"shard_scope": -(2**63) - 1}, "shard_scope=.* does not fit", id="scope-int64"),
    pytest.param({"category": 2**64}, "category=.* does not fit", id="category-int64"),
    pytest.param({"shard_identifier": -(2**63) - 1}, "does not fit", id="shard-identifier-int64"),
    pytest.param({"object_identifier": 2**63}, "does not fit", id="object-identifier-int64"),
    pytest.param({"object_identifier": 1.0}, "must be an integer", id="identifier-float"),
    pytest.param({"shard_identifier": True}, "must be an integer", id="identifier-bool"),
    pytest.param({"shard_identifier": None}, "must be an integer", id="identifier-none"),
    pytest.param({"category": "2"}, "must be an integer", id="category-string"),
]


@pytest.mark.parametrize(("fields", "message"), REFUSED_REGION_ROWS)
def test_bad_region_row_is_refused_before_any_sql(fields, message):
    assert_refused_before_any_sql(RegionOutboxFactory, fields, message, "default")


class _NoRegion(ControlOutboxFactory):
    """A control row built without any region_name."""

    region_name = None

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        kwargs.pop("region_name")
        row = model_class(*args, **kwargs)
        row.save()
        return row


REFUSED_CONTROL_ROWS = [
    pytest.param(_NoRegion, {}, "needs a non-empty region_name", id="region-missing"),
    pytest.param(ControlOutboxFactory, {"region_name": ""}, "non-empty", id="region-empty"),
    pytest.param(ControlOutboxFactory, {"region_name": " \t"}, "non-empty", id="region-blank"),
    pytest.param(ControlOutboxFactory, {"region_name": 5}, "non-empty", id="region-not-a-string"),
    pytest.param(ControlOutboxFactory, {"region_name": "x" * 49}, "over 48", id="region-too-long"),
    pytest.param(ControlOutboxFactory, {"region_name": "u\x00s"}, "NUL", id="region-nul"),
    pytest.param(
        ControlOutboxFactory, {"region_name": "\ud800"}, "surrogate", id="region-surrogate"
    ),
    pytest.param(
        ControlOutboxFactory,
        {"category": Category.AUDIT_EVENT},
        "belongs to scope Scope.ORGANIZATION, not to Scope.USER",
        id="control-category-outside-scope",
    ),
]


@pytest.mark.parametrize(("factory", "fields", "message"), REFUSED_CONTROL_ROWS)
def test_bad_control_row_is_refused_before_any_sql(factory, fields, message):
    assert_refused_before_any_sql(factory, fields, message, "control")


@pytest.mark.usefixtures("scratch_registry")
@pytest.mark.parametrize(
    ("scope_value", "category_value", "message"),
    [
        pytest.param(2**31, 7001, "HugeScope.HUGE = 2147483648 does not fit", id="scope-over"),
        pytest.param(-(2**31) - 1, 7002, "HugeScope.HUGE = -2147483649", id="scope-under"),
    ],
)
def test_declared_scope_beyond_its_int_column_is_refused(scope_value, category_value, message):
    # The 32-bit columns cannot store such values (PostgreSQL would fail mid-transaction,
    # MariaDB refuse the statement, SQLite store them): the declaration itself fails.
    class HugeCategory(OutboxCategory):
        HUGE = category_value

    with pytest.raises(OutboxConfigurationError, match=re.escape(message)):

        class HugeScope(OutboxScope):
            HUGE = scope_value, {HugeCategory.HUGE}


@pytest.mark.usefixtures("scratch_registry")
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_declared_category_beyond_its_int_column_is_refused_before_any_scope_lists_it(value):
    # Checked as the class is created: `manage.py check` imports it even if no scope does.
    with pytest.raises(OutboxConfigurationError, match=rf"BigCategory.BIG = {value} does not fit"):

        class BigCategory(OutboxCategory):
            BIG = value


# Accepted inputs, and what the receiver gets.
ROUND_TRIPS = [
    pytest.param(nested(31), nested(31), id="nested-31-deep"),
    pytest.param(
        {"deep": nested(30), "wide": [[]] * 40},
        {"deep": nested(30), "wide": [[]] * 40},
        id="nested-31-deep-and-wide",
    ),
    pytest.param({"emoji": "\ud83d\ude00"}, {"emoji": "\U0001f600"}, id="surrogate-pair"),
    pytest.param({"text": "\\u0000 \\ud800"}, {"text": "\\u0000 \\ud800"}, id="escaped-text"),
    pytest.param({"text": "한국어 ✓"}, {"text": "한국어 ✓"}, id="non-ascii"),
    pytest.param({1: (2, 3), 2.5: None}, {"1": [2, 3], "2.5": None}, id="json-round-trip"),
    pytest.param(
        {"big": 10**30, "small": -(10**30)}, {"big": 10**30, "small": -(10**30)}, id="big-ints"
    ),
    pytest.param(None, None, id="null"),
]


@pytest.mark.parametrize(("payload", "delivered"), ROUND_TRIPS)
def test_accepted_payload_is_delivered_as_its_json(payload, delivered, calls):
    with outbox_context(transaction.atomic()):
        RegionOutboxFactory(payload=payload)
    assert calls.payloads() == [delivered]
    assert not RegionOutbox.objects.exists()


@pytest.mark.parametrize("with_null", [True, False], ids=["with-sql-null", "json-only"])
def test_every_accepted_payload_read_in_one_window_is_delivered_as_its_json(calls, with_null):
    """The drain decodes a window's payloads together: each receiver call still gets
    its own message's payload, whatever its neighbours hold (deep nesting, big numbers,
    non-ASCII, and a None payload, which Django stores as SQL NULL)."""
    cases = [case for case in ROUND_TRIPS if with_null or case.values[0] is not None]
    with outbox_context(transaction.atomic(), flush=False):
        for n, case in enumerate(cases):
            RegionOutboxFactory(shard_identifier=n, object_identifier=n, payload=case.values[0])
    drain_outboxes([RegionOutbox])
    delivered = {call["object_identifier"]: call["payload"] for call in calls.calls}
    assert delivered == {n: case.values[1] for n, case in enumerate(cases)}
    assert not RegionOutbox.objects.exists()


@pytest.mark.usefixtures("scratch_registry")
def test_extreme_identifiers_in_range_are_stored_and_delivered(calls):
    # Every identifier column is signed: negative values are valid, down to the minimum.
    class EdgeCategory(OutboxCategory):
        LOWEST = -(2**31)
        HIGHEST = 2**31 - 1

    class EdgeScope(OutboxScope):
        LOWEST = -(2**31), {EdgeCategory.LOWEST}
        HIGHEST = 2**31 - 1, {EdgeCategory.HIGHEST}

    edges = [
        (EdgeScope.LOWEST, -(2**63), EdgeCategory.LOWEST, -(2**63)),
        (EdgeScope.HIGHEST, 2**63 - 1, EdgeCategory.HIGHEST, 2**63 - 1),
        (EdgeScope.HIGHEST, -1, EdgeCategory.HIGHEST, 0),
    ]
    for category in EdgeCategory:
        process_region_outbox.connect(record, sender=category)
    try:
        with outbox_context(flush=False):
            for scope, shard, category, obj in edges:
                RegionOutboxFactory(
                    shard_scope=scope,
                    shard_identifier=shard,
                    category=category,
                    object_identifier=obj,
                    payload={"shard": shard},
                )
        stats = drain_outboxes()
    finally:
        for category in EdgeCategory:
            process_region_outbox.disconnect(record, sender=category)
    assert stats.receiver_calls == 3 and stats.failures == 0
    got = {
        (c["shard_scope"], c["shard_identifier"], c["category"], c["object_identifier"])
        for c in calls.calls
    }
    assert got == {(int(s), i, int(c), o) for s, i, c, o in edges}
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()


def test_strict_mode_refuses_saves_outside_a_context_inside_a_usable_transaction(settings):
    settings.OUTBOX_REQUIRE_CONTEXT = True
    with transaction.atomic():
        with CaptureQueriesContext(connections["default"]) as queries:
            with pytest.raises(OutboxContextRequired, match="inside outbox_context"):
                RegionOutboxFactory()
            with pytest.raises(OutboxContextRequired):
                RegionOutbox.objects.bulk_create([RegionOutboxFactory.build()])
        assert queries.captured_queries == []
        Ledger.objects.create(entry=1)
    with transaction.atomic(using="control"), pytest.raises(OutboxContextRequired):
        ControlOutboxFactory()
    assert list(Ledger.objects.values_list("entry", flat=True)) == [1]
    assert not RegionOutbox.objects.exists() and not ControlOutbox.objects.exists()
    # Producer models open their own outbox_context, so strict mode lets them write.
    Organization.objects.create(name="produced")
    assert not RegionOutbox.objects.exists()  # flushed after its commit


# -- a receiver interrupting the engine -------------------------------------------------


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("path", ["drain", "flush"])
@pytest.mark.parametrize(
    "category", [Category.AUDIT_EVENT, Category.LEDGER_ENTRY], ids=["plain", "transactional"]
)
def test_interrupting_receiver_is_never_success_and_its_shard_is_released(
    interrupt, path, category, calls
):
    """Documented: the engine does not swallow it. It deletes the groups delivered before
    the interrupt, keeps the interrupted group's rows as they were (no attempt counted),
    releases every lease of the batch at once, and re-raises."""

    def interrupt_once(sender, kwargs):
        if kwargs["payload"] == {"v": "boom"} and not interrupted:
            interrupted.append(True)
            raise interrupt

    interrupted = []
    calls.during_call = interrupt_once
    rows = [
        (1, 1, Category.AUDIT_EVENT, {"v": "before"}),
        (1, 2, category, {"v": "boom"}),
        (1, 3, Category.AUDIT_EVENT, {"v": "after"}),
        (2, 4, Category.AUDIT_EVENT, {"v": "other shard"}),
    ]

    def write():
        for shard, obj, cat, payload in rows:
            RegionOutboxFactory(
                shard_identifier=shard, object_identifier=obj, category=cat, payload=payload
            )

    with pytest.raises(interrupt):
        if path == "drain":
            with outbox_context(flush=False):
                write()
            drain_outboxes()
        else:
            with outbox_context(transaction.atomic()):
                write()
    assert interrupted
    # The group delivered before the interrupt is retired; the interrupted one and the
    # one after it (same shard, in order) are kept untouched.
    assert [c["payload"] for c in calls.calls if c["shard_identifier"] == 1] == [{"v": "before"}]
    assert sorted(
        RegionOutbox.objects.filter(shard_identifier=1).values_list(
            "object_identifier", "attempts", "last_error", "first_attempt_at"
        )
    ) == [(2, 0, "", None), (3, 0, "", None)]
    assert not Ledger.objects.exists()  # a transactional receiver's writes rolled back
    assert not ShardLease.objects.exists()  # released at once, not left to expire
    # Nothing stuck: the next drain delivers the rest, in order.
    drain_outboxes()
    shard_one = [c["payload"]["v"] for c in calls.calls if c["shard_identifier"] == 1]
    assert shard_one == ["before", "boom", "after"]
    assert {"v": "other shard"} in calls.payloads()
    assert not RegionOutbox.objects.exists()


# -- the database unreachable during a synchronous flush --------------------------------


def _server_id(connection):
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
        return cursor.fetchone()[0]


class Outage:
    """Makes one connection unusable for real, and repairs it afterwards.

    `kill()`: PostgreSQL and MariaDB terminate the connection's server process from
    another connection (pg_terminate_backend, KILL CONNECTION); SQLite has no server,
    so its open database handle is closed under Django instead. `refuse()`: the
    connection is closed and its settings point at a port where nothing listens (SQLite:
    at a file that cannot be opened), so reconnecting fails.
    """

    def __init__(self, alias):
        self.alias = alias
        self.connection = connections[alias]
        self.saved_settings = dict(self.connection.settings_dict)
        self.sqlite_handle = None
        self.blocked_port = None

    def kill(self):
        connection = self.connection
        if connection.vendor == "sqlite":
            self.sqlite_handle = connection.connection
            dead = sqlite3.connect(":memory:")
            dead.close()
            connection.connection = dead
            return
        victim = _server_id(connection)
        killer = connections.create_connection(self.alias)
        try:
            with killer.cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [victim])
                    alive = "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s"
                else:
                    cursor.execute(f"KILL CONNECTION {int(victim)}")
                    alive = "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s"
                for _ in range(200):  # gone for sure before the flush runs
                    cursor.execute(alive, [victim])
                    if not cursor.fetchone()[0]:
                        break
                    time.sleep(0.01)
                else:
                    raise AssertionError(f"connection {victim} survived its termination")
        finally:
            killer.close()

    def refuse(self):
        connection = self.connection
        if connection.vendor == "sqlite":
            self.sqlite_handle = connection.connection
            connection.connection = None
            connection.settings_dict["NAME"] = "file:/nonexistent-outbox-dir/db.sqlite3?mode=rw"
            return
        connection.close()
        # A bound socket that does not listen: connecting to it is refused at once.
        self.blocked_port = socket.socket()
        self.blocked_port.bind(("127.0.0.1", 0))
        connection.settings_dict["HOST"] = "127.0.0.1"
        connection.settings_dict["PORT"] = str(self.blocked_port.getsockname()[1])

    def repair(self):
        connection = self.connection
        connection.settings_dict.update(self.saved_settings)
        if self.blocked_port is not None:
            self.blocked_port.close()
            self.blocked_port = None
        if self.sqlite_handle is not None:
            connection.connection = self.sqlite_handle
            self.sqlite_handle = None
        elif connection.vendor != "sqlite":
            with contextlib.suppress(DatabaseDriverError):
                connection.close()  # the next query reconnects


@pytest.fixture
def outage():
    broken = Outage("default")
    yield broken
    broken.repair()


def flush_failures(caplog):
    return [r for r in caplog.records if getattr(r, "event", None) == "outbox.flush_failed"]


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize(
    "when", ["killed-after-commit", "refused-after-commit", "killed-in-receiver"]
)
def test_database_unreachable_during_the_flush(when, strict, outage, calls, caplog, settings):
    """Default: the commit is durable, the `with` block ends normally, the failure is
    logged and the rows stay for the drain. OUTBOX_FLUSH_STRICT: the database error is
    raised from the block instead."""
    settings.OUTBOX_FLUSH_STRICT = strict
    if when == "killed-in-receiver":

        def kill_during_first_call(sender, kwargs):
            # The receiver succeeds, but the connection dies before the delete is written.
            if not calls.calls:
                outage.kill()

        calls.during_call = kill_during_first_call
    raised = None
    with caplog.at_level(logging.WARNING, logger="outbox"):
        try:
            with outbox_context(transaction.atomic()):
                Ledger.objects.create(entry=1)
                if when != "killed-in-receiver":
                    # Registered before the row's flush hook, so it runs first after commit.
                    transaction.on_commit(
                        outage.kill if when == "killed-after-commit" else outage.refuse
                    )
                RegionOutboxFactory(shard_identifier=5, payload={"v": 1})
        except DatabaseDriverError as exc:
            raised = exc
    outage.repair()
    if strict:
        assert raised is not None and not flush_failures(caplog)
    else:
        assert raised is None
        [failure] = flush_failures(caplog)
        assert failure.using == "default" and failure.exc_info is not None
    # Durable: the transaction committed before the flush ran, row and all.
    assert list(Ledger.objects.values_list("entry", flat=True)) == [1]
    row = RegionOutbox.objects.get()
    assert row.attempts == 0  # not a receiver failure: nothing to back off
    if when == "killed-in-receiver":
        # Delivered, but neither deleted nor released: the shard waits for its lease to
        # expire (the database was gone), then is delivered again (at least once).
        assert calls.payloads() == [{"v": 1}]
        assert ShardLease.objects.get().token is not None
        assert drain_outboxes().receiver_calls == 0
        ShardLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    else:
        assert calls.calls == [] and not ShardLease.objects.exists()
    drain_outboxes()
    assert calls.payloads() == [{"v": 1}] * (2 if when == "killed-in-receiver" else 1)
    assert not RegionOutbox.objects.exists() and not ShardLease.objects.exists()
