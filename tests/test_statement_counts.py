"""Statements of the default write path and of the synchronous flush after it, pinned on
every test database (the drain's are pinned in test_claim_scan, test_claim_ahead and
test_mariadb_backend), so that a rebuild of the engine cannot grow them unseen.

Counted is every statement Django's cursors send on the default database, from any thread
and on any connection, those opened before the count started included (a kept delivery
slot's, the lease keeper's), and every COMMIT of a transaction (the driver's `commit()`,
no cursor statement). SQLite's BEGIN goes through the cursor under some Python and Django
versions and not others, so it is left out; the transaction still shows by its COMMIT.
Each count is taken after a warm-up message, so that what a connection does once (the
isolation level asked, a statement prepared) is left out. The suite's own
OUTBOX_CONCURRENCY is taken away: the library's default applies, as in a project.
"""

import threading
from contextlib import contextmanager

import django
import pytest
from django.conf import settings as django_settings
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from outbox import outbox_context
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.testapp.categories import Category, Scope
from tests.testapp.models import Organization

pytestmark = committing

# The test database leg, as OUTBOX_TEST_DB names it.
LEG = django_settings.TEST_DB + ("" if django_settings.OUTBOX_FAST_PATH else "-portable")

COMMIT = "COMMIT"  # how a transaction's commit shows among the statements

# One outbox row saved in `outbox_context(transaction.atomic())`, as the README writes
# it: its INSERT, then the COMMIT. The same on every database.
WRITE = {
    "sqlite": 2,
    "postgres": 2,
    "postgres-portable": 2,
    "mariadb": 2,
    "mariadb-portable": 2,
}

# A producer's `save()` of an existing object in autocommit, the transaction its own:
# the object's UPDATE, its message's INSERT, then the COMMIT.
PRODUCER_WRITE = {
    "sqlite": 3,
    "postgres": 3,
    "postgres-portable": 3,
    "mariadb": 3,
    "mariadb-portable": 3,
}

# The same `save()` inside the caller's `outbox_context(transaction.atomic())`: the
# producer's own atomic block becomes a savepoint, so SAVEPOINT, the UPDATE, the INSERT,
# RELEASE SAVEPOINT, then the caller's COMMIT.
PRODUCER_WRITE_IN_ATOMIC = {
    "sqlite": 5,
    "postgres": 5,
    "postgres-portable": 5,
    "mariadb": 5,
    "mariadb-portable": 5,
}

# The synchronous flush of that one message after the commit:
# - PostgreSQL's fast path: the claim and the read in one statement, the delete of the
#   row and the release of the lease in one, no transaction;
# - MariaDB's: find the due shard, lease it (INSERT), read it, delete its row, release
#   the lease, no transaction;
# - the portable path (SQLite, PostgreSQL and MariaDB without the fast path): find the
#   due shard, take over an expired lease (UPDATE), lease a free shard (INSERT) and
#   COMMIT that, read the leases won, read the window, read the rows, delete the row,
#   release the lease.
#   Django 6 sends that INSERT (`bulk_create` of one batch) in autocommit, without a
#   transaction of its own: the same statements, no COMMIT call.
_PORTABLE_FLUSH = 9 if django.VERSION < (6,) else 8
FLUSH = {
    "sqlite": _PORTABLE_FLUSH,
    "postgres": 2,
    "postgres-portable": _PORTABLE_FLUSH,
    "mariadb": 5,
    "mariadb-portable": _PORTABLE_FLUSH,
}


@contextmanager
def sent_on_default():
    """The statements sent on the default database meanwhile, as (thread name, SQL), with
    (thread name, COMMIT) for each commit. Django's cursor wrapper and connection class
    are patched for the time being, so no connection or thread can send unseen."""
    seen: list[tuple[str, str]] = []
    execute, executemany, commit = (
        CursorWrapper.execute,
        CursorWrapper.executemany,
        BaseDatabaseWrapper.commit,
    )

    def record(alias, sql):
        if alias == "default" and not sql.lstrip().upper().startswith("BEGIN"):
            seen.append((threading.current_thread().name, sql))

    def recorded_execute(self, sql, params=None):
        record(self.db.alias, sql)
        return execute(self, sql, params)

    def recorded_executemany(self, sql, param_list):
        record(self.db.alias, sql)
        return executemany(self, sql, param_list)

    def recorded_commit(self):
        record(self.alias, COMMIT)
        return commit(self)

    CursorWrapper.execute = recorded_execute
    CursorWrapper.executemany = recorded_executemany
    BaseDatabaseWrapper.commit = recorded_commit
    try:
        yield seen
    finally:
        CursorWrapper.execute = execute
        CursorWrapper.executemany = executemany
        BaseDatabaseWrapper.commit = commit


def sent_by(write):
    """Run `write()`, which commits one transaction; the statements sent up to its
    COMMIT (included) and those sent after it, the flush's."""
    with sent_on_default() as seen:
        write()
    commits = [n for n, (thread, sql) in enumerate(seen) if sql == COMMIT]
    assert commits, seen  # the write committed its transaction
    return seen[: commits[0] + 1], seen[commits[0] + 1 :]


def save_row(shard, **context):
    with outbox_context(transaction.atomic(), **context):
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            category=Category.AUDIT_EVENT,
            object_identifier=shard,
            payload={"shard": shard},
        ).save()


@pytest.fixture
def warm(calls, settings):
    """The library's default concurrency, and a message written and flushed first, on a
    shard of its own."""
    del settings.OUTBOX_CONCURRENCY
    save_row(99)
    assert not RegionOutbox.objects.exists() and len(calls.calls) == 1
    calls.reset()


def test_a_row_left_to_the_drain(warm, calls):
    written, after = sent_by(lambda: save_row(1, flush=False))
    assert len(written) == WRITE[LEG], written
    assert after == []  # left to the drain: nothing after the commit
    assert RegionOutbox.objects.count() == 1 and calls.calls == []


def test_a_row_and_its_synchronous_flush(warm, calls):
    written, flushed = sent_by(lambda: save_row(1))  # flushed by default
    assert len(written) == WRITE[LEG], written
    assert len(flushed) == FLUSH[LEG], flushed
    assert not RegionOutbox.objects.exists() and len(calls.calls) == 1


@pytest.mark.parametrize("in_atomic", [False, True], ids=["own transaction", "in atomic"])
def test_a_producer_save_and_its_synchronous_flush(warm, calls, in_atomic):
    organization = Organization.objects.create(name="before")  # flushed on its own
    calls.reset()
    organization.name = "after"
    if in_atomic:
        written, flushed = sent_by(lambda: save_in_atomic(organization))
        assert len(written) == PRODUCER_WRITE_IN_ATOMIC[LEG], written
    else:
        written, flushed = sent_by(organization.save)
        assert len(written) == PRODUCER_WRITE[LEG], written
    assert len(flushed) == FLUSH[LEG], flushed
    assert not RegionOutbox.objects.exists()
    assert [kwargs["payload"] for kwargs in calls.calls] == [{"name": "after"}]


def save_in_atomic(organization):
    with outbox_context(transaction.atomic()):
        organization.save()
