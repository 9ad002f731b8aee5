"""Stateful property tests: random interleavings checked against a model of the contract.

Hypothesis drives one database connection through random sequences of these rules:

- ``begin``: open a transaction with ``outbox_context(transaction.atomic(), flush=...)``
  (with OUTBOX_DEFER_WRITES on or off), or a savepoint in the open one;
- ``write``, ``write_bulk``, ``write_again``: outbox rows by ``save()`` or
  ``bulk_create``, in the open transaction or, outside any, in autocommit and left to the
  drain. Three shards; per shard two shared objects (their rows coalesce), unique
  objects, and ledger entries, whose transactional receiver writes a Ledger row;
  ``write_again`` writes a new message for a group written before;
- ``commit`` / ``rollback`` of the innermost level (raising through it, or
  ``transaction.set_rollback(True)``); a flush=True commit is a synchronous flush;
  ``whole_transaction`` does a transaction with a savepoint in one step;
- ``drain``: ``drain_outboxes()``, which must refuse while a transaction is open;
- ``toggle_receiver``: the receiver for one kind of object in one shard starts or
  stops raising (``failing_receivers`` sets some up before the first step);
- ``pass_backoff``: time passes beyond every back-off (leases and rows moved back);
- ``recover``: receivers succeed, back-off passes, a drain runs: the outbox must be
  empty and each group's last delivered payload its last committed one. Every example
  that has not failed already ends with it.

The model (`Model`) is plain Python: the committed rows of each shard in write order,
with their failed attempts, the shards backing off, and which receivers fail. Delivering
a shard walks its groups in order of their oldest row; a group's call carries its newest
payload and retires all its rows; a failing group counts an attempt on each of its rows
and backs the shard off. So the model predicts, per shard, the exact receiver calls of a
step, and the rows (with attempts) and back-offs it leaves. After each step that leaves
no transaction open, the receiver calls and the database are compared with it.

Besides, checks that do not rest on the model's predictions: rolled-back messages are
never delivered and leave no row; each call carries the newest committed payload of its
group, and per group the delivered payloads only grow newer; per shard, groups go in
order of their oldest pending row; a row disappears only with a successful call for it
or a newer row of its group; after a drain only backing-off shards have rows; no lease
is held after a step; the Ledger holds exactly the delivered ledger entries.

While a transaction is open nothing is read from the database (the write path may hold
rows until commit); only that no receiver ran is checked. A shard written only inside a
rolled-back savepoint may or may not be flushed by the outer commit (the flush sends
committed rows only); the model takes whichever outcome the database shows.

In CI the run is derandomized and bounded (the "ci" profile, about 10-30 s per
database). For a longer, random search, by hand::

    OUTBOX_PROPERTIES=thorough OUTBOX_TEST_DB=postgres .venv/bin/python -m pytest \\
        tests/test_properties.py
"""

from __future__ import annotations

import copy
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import override_settings
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from outbox import outbox_context, unique_object_identifier
from outbox.engine import drain_outboxes
from outbox.exceptions import DrainInTransaction
from outbox.models import RegionOutbox, ShardLease
from tests.conftest import committing
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Ledger
from tests.testapp.receivers import recorder

_EVERY_PROFILE = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
PROFILES = {
    "ci": hypothesis_settings(
        max_examples=80,
        stateful_step_count=40,
        derandomize=True,
        print_blob=False,
        report_multiple_bugs=False,
        **_EVERY_PROFILE,
    ),
    "thorough": hypothesis_settings(
        max_examples=300,
        stateful_step_count=60,
        derandomize=False,
        print_blob=True,
        **_EVERY_PROFILE,
    ),
}

SHARDS = (1, 2, 3)
# What a message is about: a shared object (its rows coalesce), a unique object, or a
# ledger entry (unique too; its transactional receiver writes a Ledger row).
SHARED_OBJECTS = (1, 2)
UNIQUE = 0
LEDGER = -1
KINDS = (*SHARED_OBJECTS, UNIQUE, LEDGER)
CATEGORIES = (Category.ORGANIZATION_UPDATE, Category.AUDIT_EVENT)  # for all but ledger entries
MAX_DEPTH = 3  # transaction plus two savepoints

Group = tuple[int, int, int]  # shard, category, object_identifier
Spec = tuple[int, int, int]  # shard, category, kind of a message to write

kinds = st.sampled_from(KINDS)
messages = st.tuples(st.sampled_from(SHARDS), st.sampled_from(CATEGORIES), kinds)
same_shard_messages = st.lists(st.tuples(st.sampled_from(CATEGORIES), kinds), max_size=3)
flush_choices = st.sampled_from((None, True, False))  # None: inherit (True outermost)


@dataclass(frozen=True)
class Message:
    seq: int  # write order; also the payload, {"seq": seq}
    shard: int
    category: int
    obj: int

    @property
    def group(self) -> Group:
        return (self.shard, self.category, self.obj)

    @property
    def kind(self) -> int:
        return kind_of(self.category, self.obj)


@dataclass
class Pending:
    message: Message
    attempts: int = 0


class ReceiverDown(Exception):
    """What a failing receiver raises."""


class Model:
    """What the contract says the outbox holds and delivers, single-threaded."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Pending]] = {shard: [] for shard in SHARDS}
        self.blocked: set[int] = set()  # shards backing off
        self.reached: set[int] = set()  # of those, shards written to since their failure
        self.failing: set[tuple[int, int]] = set()  # (shard, kind) whose receiver raises
        self.newest_committed: dict[Group, int] = {}
        self.committed: set[int] = set()
        self.rolled_back: set[int] = set()
        self.recent: list[Message] = []  # committed since the last check
        self.calls: list[Message] = []  # predicted calls since the last check
        self.ledger: set[int] = set()

    def commit(self, written: Iterable[Message]) -> None:
        for message in sorted(written, key=lambda m: m.seq):
            self.rows[message.shard].append(Pending(message))
            if message.shard in self.blocked:  # wakes it for one early attempt
                self.reached.add(message.shard)
            self.newest_committed[message.group] = message.seq
            self.committed.add(message.seq)
            self.recent.append(message)

    def groups(self) -> list[Group]:
        """The groups committed so far, but ledger entries (each is written once)."""
        return sorted(g for g in self.newest_committed if g[1] != Category.LEDGER_ENTRY)

    def deliver(self, shard: int, bound: int | None = None) -> None:
        """Deliver a shard's groups in order of their oldest row, up to a failing one.

        A flush starts only the groups whose oldest row is up to its `bound` (each still
        with its newest payload, and retiring all its rows). A backing-off shard written to
        since its failure is woken first, for one attempt."""
        if shard in self.reached:
            self.blocked.discard(shard)
            self.reached.discard(shard)
        while shard not in self.blocked:
            started = [p for p in self.rows[shard] if bound is None or p.message.seq <= bound]
            if not started:
                return
            head = started[0].message
            members = [p for p in self.rows[shard] if p.message.group == head.group]
            if (shard, head.kind) in self.failing:
                for pending in members:
                    pending.attempts += 1
                self.blocked.add(shard)
                self.reached.discard(shard)
                return
            newest = members[-1].message
            self.calls.append(newest)
            if newest.category == Category.LEDGER_ENTRY:
                self.ledger.add(newest.obj)
            self.rows[shard] = [p for p in self.rows[shard] if p not in members]

    def drain(self) -> None:
        for shard in SHARDS:
            self.deliver(shard)

    def row_states(self) -> list[tuple[Message, int]]:
        pending = [p for rows in self.rows.values() for p in rows]
        return [(p.message, p.attempts) for p in sorted(pending, key=lambda p: p.message.seq)]

    def shard_view(self, shard: int) -> tuple[list[Message], list[tuple[Message, int]], bool]:
        calls = [m for m in self.calls if m.shard == shard]
        rows = [(p.message, p.attempts) for p in self.rows[shard]]
        return calls, rows, shard in self.blocked


@dataclass
class Level:
    """One open `outbox_context` block: the transaction or a savepoint in it."""

    block: Any  # the entered outbox_context(...) context manager
    flush: bool  # whether rows written at this level are flushed after the commit
    written: list[Message] = field(default_factory=list)  # kept writes, with savepoints'
    flushed: list[Message] = field(default_factory=list)  # of those, the ones to flush
    lost: list[Message] = field(default_factory=list)  # to flush, but rolled back


@dataclass
class Observed:
    """The receiver calls since the last check, the rows, and the shards backing off."""

    calls: list[Message]
    rows: list[tuple[Message, int]]
    backing_off: set[int]

    def shard_view(self, shard: int) -> tuple[list[Message], list[tuple[Message, int]], bool]:
        calls = [m for m in self.calls if m.shard == shard]
        rows = [row for row in self.rows if row[0].shard == shard]
        return calls, rows, shard in self.backing_off


def newest_per_shard(messages: Iterable[Message]) -> dict[int, int]:
    newest: dict[int, int] = {}
    for message in messages:
        newest[message.shard] = max(newest.get(message.shard, 0), message.seq)
    return newest


def tracked(step: Callable[..., None]) -> Callable[..., None]:
    """Count the steps that started and did not finish (they raised), so that teardown
    skips the final recovery after a failure: it would only hide the first error."""

    @functools.wraps(step)
    def run(self: OutboxMachine, **kwargs: Any) -> None:
        self.unfinished += 1
        step(self, **kwargs)
        self.unfinished -= 1

    return run


def kind_of(category: int, obj: int) -> int:
    if category == Category.LEDGER_ENTRY:
        return LEDGER
    return obj if obj in SHARED_OBJECTS else UNIQUE


def outbox_row(message: Message) -> RegionOutbox:
    return RegionOutbox(
        shard_scope=Scope.ORGANIZATION,
        shard_identifier=message.shard,
        category=message.category,
        object_identifier=message.obj,
        payload={"seq": message.seq},
    )


def db_rows() -> list[tuple[Message, int]]:
    """The outbox as (message, attempts), in id order; checks last_error on the way."""
    rows = []
    for row in RegionOutbox.objects.order_by("id"):
        assert bool(row.last_error) == (row.attempts > 0), row.last_error
        assert row.shard_scope == Scope.ORGANIZATION
        message = Message(
            row.payload["seq"], row.shard_identifier, row.category, row.object_identifier
        )
        rows.append((message, row.attempts))
    return rows


def backing_off() -> set[int]:
    live = ShardLease.objects.filter(token__isnull=True, expires_at__gt=Now())
    return set(live.values_list("shard_identifier", flat=True))


def after_failures_tick() -> None:
    """A write wakes a shard backing off when it is later than the failure on the
    database clock (`outbox.backends.wake`); SQLite's counts milliseconds, so the next
    step's writes wait for the next one."""
    if connection.vendor == "sqlite":
        time.sleep(0.002)


def per_shard(calls: Iterable[Message]) -> dict[int, list[Message]]:
    shards: dict[int, list[Message]] = {}
    for message in calls:
        shards.setdefault(message.shard, []).append(message)
    return shards


def clear_tables() -> None:
    RegionOutbox.objects.all().delete()
    ShardLease.objects.all().delete()
    Ledger.objects.all().delete()


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        clear_tables()
        recorder.reset()
        recorder.during_call = self.receiver_hook
        self.model = Model()
        self.levels: list[Level] = []
        self.seq = 0
        self.seen = 0  # recorder calls already checked
        self.snapshot: list[tuple[Message, int]] = []  # the rows at the last check
        self.delivered: dict[Group, int] = {}  # the newest payload delivered per group
        self.drained = False
        self.unfinished = 0

    def receiver_hook(self, sender: Any, kwargs: dict[str, Any]) -> None:
        obj = kwargs["object_identifier"]
        if (kwargs["shard_identifier"], kind_of(sender, obj)) in self.model.failing:
            raise ReceiverDown(f"receiver failed for object {obj}")

    def in_transaction(self) -> bool:
        return bool(self.levels)

    # -- writes and transactions ---------------------------------------------------------

    @initialize(failing=st.sets(st.tuples(st.sampled_from(SHARDS), kinds), min_size=1, max_size=3))
    @tracked
    def failing_receivers(self, failing: set[tuple[int, int]]) -> None:
        self.model.failing = set(failing)

    @precondition(lambda self: len(self.levels) < MAX_DEPTH)
    @rule(flush=flush_choices, defer=st.booleans())
    @tracked
    def begin(self, flush: bool | None, defer: bool) -> None:
        """Open a transaction (holding its rows until commit, or writing them at once),
        or a savepoint in the open one; flush=None inherits (True at the outermost)."""
        block = outbox_context(transaction.atomic(), flush=flush)
        with override_settings(OUTBOX_DEFER_WRITES=defer):  # read as the transaction opens
            block.__enter__()
        inherited = self.levels[-1].flush if self.levels else True
        self.levels.append(Level(block, inherited if flush is None else flush))

    @rule(spec=messages)
    @tracked
    def write(self, spec: Spec) -> None:
        message = self.new_message(*spec)
        outbox_row(message).save()
        self.wrote([message])

    @rule(specs=st.lists(messages, min_size=1, max_size=4))
    @tracked
    def write_bulk(self, specs: list[Spec]) -> None:
        written = [self.new_message(*spec) for spec in specs]
        RegionOutbox.objects.bulk_create([outbox_row(message) for message in written])
        self.wrote(written)

    @precondition(lambda self: self.model.groups())
    @rule(pick=st.integers(min_value=0, max_value=100))
    @tracked
    def write_again(self, pick: int) -> None:
        """A new message for a group written before: the same object, updated again."""
        groups = self.model.groups()
        shard, category, obj = groups[pick % len(groups)]
        self.seq += 1
        message = Message(self.seq, shard, category, obj)
        outbox_row(message).save()
        self.wrote([message])

    def new_message(self, shard: int, category: int, kind: int) -> Message:
        self.seq += 1
        if kind == LEDGER:
            category = Category.LEDGER_ENTRY
        obj = kind if kind in SHARED_OBJECTS else unique_object_identifier()
        return Message(self.seq, shard, int(category), obj)

    def wrote(self, written: list[Message]) -> None:
        if not self.levels:  # autocommit, outside any outbox_context: left to the drain
            self.model.commit(written)
            return
        level = self.levels[-1]
        level.written.extend(written)
        if level.flush:
            level.flushed.extend(written)

    @precondition(in_transaction)
    @rule()
    @tracked
    def commit(self) -> None:
        level = self.levels.pop()
        level.block.__exit__(None, None, None)
        if self.levels:  # a savepoint released into its transaction
            parent = self.levels[-1]
            parent.written += level.written
            parent.flushed += level.flushed
            parent.lost += level.lost
            return
        self.model.commit(level.written)
        if level.flushed:  # a flush runs when some row to flush was kept
            self.model_flush(level)
            after_failures_tick()

    def model_flush(self, level: Level) -> None:
        """Flush each shard up to the newest row to flush that the transaction wrote.

        Whether such rows in a rolled-back savepoint count (for the bound, and for shards
        written only there) is left open: of these outcomes, the model takes the one the
        database shows, and the checks compare against it."""
        kept = newest_per_shard(level.flushed)
        written = newest_per_shard(level.flushed + level.lost)
        observed = self.observe()
        for shard in sorted(written):
            bounds = dict.fromkeys((kept.get(shard), written[shard]))  # None: no flush
            self.model = self.outcome_shown(shard, list(bounds), observed)

    def outcome_shown(self, shard: int, bounds: list[int | None], observed: Observed) -> Model:
        outcomes = []
        for bound in bounds:
            outcome = copy.deepcopy(self.model)
            if bound is not None:
                outcome.deliver(shard, bound)
            outcomes.append(outcome)
        shown = [o for o in outcomes if o.shard_view(shard) == observed.shard_view(shard)]
        return (shown or outcomes)[0]

    def observe(self) -> Observed:
        return Observed(self.observed_calls(), db_rows(), backing_off())

    @precondition(in_transaction)
    @rule(by_exception=st.booleans())
    @tracked
    def rollback(self, by_exception: bool) -> None:
        level = self.levels.pop()
        if by_exception:
            error = ReceiverDown("raised inside the block")
            assert level.block.__exit__(type(error), error, None) is False
        else:
            transaction.set_rollback(True)
            level.block.__exit__(None, None, None)
        self.model.rolled_back.update(message.seq for message in level.written)
        if self.levels:
            self.levels[-1].lost += level.flushed + level.lost

    @precondition(lambda self: not self.levels)
    @rule(
        shard=st.sampled_from(SHARDS),
        flushes=st.tuples(flush_choices, flush_choices),
        defer=st.booleans(),
        before=same_shard_messages,
        inner=same_shard_messages,
        keep_inner=st.booleans(),
        after=st.lists(messages, max_size=2),
        keep=st.booleans(),
        by_exception=st.booleans(),
    )
    @tracked
    def whole_transaction(
        self,
        shard: int,
        flushes: tuple[bool | None, bool | None],
        defer: bool,
        before: list[tuple[int, int]],
        inner: list[tuple[int, int]],
        keep_inner: bool,
        after: list[Spec],
        keep: bool,
        by_exception: bool,
    ) -> None:
        """The rules above in one step: a transaction writes to a shard, a savepoint in
        it (with its own flush choice) too, then the transaction writes anywhere."""
        self.begin(flush=flushes[0], defer=defer)
        for category, kind in before:
            self.write(spec=(shard, category, kind))
        self.begin(flush=flushes[1], defer=defer)
        for category, kind in inner:
            self.write(spec=(shard, category, kind))
        if keep_inner:
            self.commit()
        else:
            self.rollback(by_exception=True)
        for spec in after:
            self.write(spec=spec)
        if keep:
            self.commit()
        else:
            self.rollback(by_exception=by_exception)

    # -- the engine, receivers and time --------------------------------------------------

    @precondition(lambda self: self.levels or self.model.row_states())
    @rule()
    @tracked
    def drain(self) -> None:
        if self.levels:
            with pytest.raises(DrainInTransaction):
                drain_outboxes([RegionOutbox])
            return
        drain_outboxes([RegionOutbox])
        self.model.drain()
        self.drained = True
        after_failures_tick()

    @rule(shard=st.sampled_from(SHARDS), kind=kinds)
    @tracked
    def toggle_receiver(self, shard: int, kind: int) -> None:
        self.model.failing ^= {(shard, kind)}

    @precondition(lambda self: not self.levels and self.model.blocked)
    @rule()
    @tracked
    def pass_backoff(self) -> None:
        past = timezone.now() - timedelta(seconds=1)
        ShardLease.objects.filter(token__isnull=True).update(expires_at=past)
        RegionOutbox.objects.update(scheduled_for=past)
        self.model.blocked.clear()
        self.model.reached.clear()

    @precondition(lambda self: not self.levels and self.model.row_states())
    @rule()
    @tracked
    def recover(self) -> None:
        self.model.failing.clear()
        self.pass_backoff()
        self.drain()
        self.check()
        assert db_rows() == [], "receivers succeed and back-off passed, yet rows remain"
        assert self.delivered == self.model.newest_committed

    # -- checks --------------------------------------------------------------------------

    @invariant()
    @tracked
    def consistent(self) -> None:
        if self.levels:
            assert len(recorder.calls) == self.seen, "a receiver ran inside a transaction"
            return
        self.check()

    def observed_calls(self) -> list[Message]:
        return [
            Message(
                c["payload"]["seq"],
                c["shard_identifier"],
                int(c["category"]),
                c["object_identifier"],
            )
            for c in recorder.calls[self.seen :]
        ]

    def check(self) -> None:
        calls = self.observed_calls()
        self.seen = len(recorder.calls)
        self.check_calls(calls)
        rows = db_rows()
        self.check_order(calls)
        self.check_deletions(rows, calls)
        assert per_shard(calls) == per_shard(self.model.calls), "calls differ from the model"
        assert rows == self.model.row_states(), "rows differ from the model"
        assert backing_off() == self.model.blocked
        assert not ShardLease.objects.filter(token__isnull=False).exists(), "a lease is held"
        assert set(Ledger.objects.values_list("entry", flat=True)) == self.model.ledger
        if self.drained:
            # A failing group blocks only its own shard: the others were drained.
            assert {message.shard for message, _ in rows} <= backing_off()
        self.model.calls, self.model.recent, self.snapshot = [], [], rows
        self.drained = False

    def check_calls(self, calls: list[Message]) -> None:
        for message in calls:
            assert message.seq not in self.model.rolled_back, f"rolled back: {message}"
            assert message.seq in self.model.committed, f"never written: {message}"
            newest = self.model.newest_committed[message.group]
            assert message.seq == newest, f"{message} is not the newest ({newest})"
            assert message.seq > self.delivered.get(message.group, 0), f"older: {message}"
            self.delivered[message.group] = message.seq

    def check_order(self, calls: list[Message]) -> None:
        """Per shard, groups go in order of their oldest pending row."""
        pending = [message for message, _ in self.snapshot] + self.model.recent
        oldest: dict[Group, int] = {}
        for message in sorted(pending, key=lambda m: m.seq, reverse=True):
            oldest[message.group] = message.seq
        for shard, shard_calls in per_shard(calls).items():
            assert all(call.group in oldest for call in shard_calls), "no row was pending"
            heads = [oldest[call.group] for call in shard_calls]
            assert heads == sorted(set(heads)), f"shard {shard} out of order: {shard_calls}"

    def check_deletions(self, rows: list[tuple[Message, int]], calls: list[Message]) -> None:
        """Rows go only with a successful call for them or for a newer row of their group."""
        remaining = {message.seq for message, _ in rows}
        before = [message for message, _ in self.snapshot] + self.model.recent
        for message in before:
            if message.seq not in remaining:
                assert any(
                    call.group == message.group and call.seq >= message.seq for call in calls
                ), f"{message} was deleted without being delivered"

    def teardown(self) -> None:
        failed = self.unfinished > 0
        try:
            while self.levels:
                self.rollback(by_exception=False)
            if not failed:
                self.recover()
        finally:
            recorder.reset()
            clear_tables()


@committing
def test_random_interleavings_keep_the_contract(settings: Any) -> None:
    settings.OUTBOX_FLUSH_STRICT = True  # an engine error in a flush fails the step
    profile = PROFILES[os.environ.get("OUTBOX_PROPERTIES", "ci")]
    run_state_machine_as_test(OutboxMachine, settings=profile)


# A bug the machine above found (contract item 3: one call per group per pass, with the
# payload of the newest row at that moment). A synchronous flush read its shards only up
# to the newest row its transaction wrote, so a newer row of the same group, committed
# before the flush started, was cut off: the receiver got the older payload first.


def same_object(seq: int) -> RegionOutbox:
    return outbox_row(Message(seq, 1, Category.ORGANIZATION_UPDATE, 1))


@committing
def test_flush_sends_the_newest_row_written_after_its_bound(calls: Any) -> None:
    with outbox_context(transaction.atomic()):
        same_object(1).save()
        with outbox_context(flush=False):  # the same transaction, left to the drain
            same_object(2).save()
    assert calls.payloads() == [{"seq": 2}]


@committing
def test_flush_sends_a_newer_row_another_process_committed_first(calls: Any) -> None:
    def another_process_commits_a_newer_row() -> None:
        def write() -> None:
            try:
                same_object(2).save()
            finally:
                connection.close()

        thread = threading.Thread(target=write)
        thread.start()
        thread.join()

    with outbox_context(transaction.atomic()):
        # Commit hooks run in order: this one runs between the commit and the flush.
        transaction.on_commit(another_process_commits_a_newer_row)
        same_object(1).save()
    assert calls.payloads() == [{"seq": 2}]
