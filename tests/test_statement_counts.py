"""Statements of the default write path and of a synchronous flush, pinned on every test
database (the drain's are pinned in test_claim_scan, test_claim_ahead and
test_mariadb_backend), so that a rebuild of the engine cannot grow them unseen.

Counted is what Django's cursors send on the default database, on any thread, but the
BEGIN of a transaction, which SQLite's driver sends through the cursor or not depending on
the Python and Django versions (a COMMIT never is: the driver's `commit()`). Each count is
taken after a warm-up message, so that what a connection does once (the isolation
level asked, a statement prepared) is left out.
"""

import pytest
from django.conf import settings as django_settings
from django.db import transaction

from outbox import outbox_context
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.statements import statements_by_thread
from tests.testapp.categories import Category, Scope

pytestmark = committing

# The test database leg, as OUTBOX_TEST_DB names it.
LEG = django_settings.TEST_DB + ("" if django_settings.OUTBOX_FAST_PATH else "-portable")

# Saving one row in `outbox_context(transaction.atomic(), flush=False)`, up to the commit:
# its INSERT.
WRITE = {
    "sqlite": 1,
    "postgres": 1,
    "postgres-portable": 1,
    "mariadb": 1,
    "mariadb-portable": 1,
}

# The synchronous flush of that one message after the commit (`flush=True`):
# - PostgreSQL's fast path: claim and read in one statement, settle in one;
# - MariaDB's: find the due shard, lease it, read it, delete its row, release the lease;
# - the portable path: find the due shard, take over an expired lease (UPDATE), lease a
#   free shard (INSERT), read the leases won, read the window and the rows, delete the
#   row, release the lease.
FLUSH = {
    "sqlite": 8,
    "postgres": 2,
    "postgres-portable": 8,
    "mariadb": 5,
    "mariadb-portable": 8,
}


def save_one(shard, *, flush):
    """Save one message to `shard` in a transaction of its own; the statements sent up
    to its commit, and those sent after it."""
    committed = []  # how many statements had been sent when the commit returned
    with (
        statements_by_thread(whole=True) as seen,
        outbox_context(transaction.atomic(), flush=flush),
    ):
        # Registered before the write's own hook, so it runs first after the commit.
        transaction.on_commit(lambda: committed.append(len(seen)))
        RegionOutbox(
            shard_scope=Scope.ORGANIZATION,
            shard_identifier=shard,
            category=Category.AUDIT_EVENT,
            object_identifier=shard,
            payload={"shard": shard},
        ).save()
    sent = [(thread, sql) for thread, sql in seen[: committed[0]] if sql != "BEGIN"]
    after = [(thread, sql) for thread, sql in seen[committed[0] :] if sql != "BEGIN"]
    return sent, after


@pytest.fixture
def warm(calls):
    """A message written and flushed first, on a shard of its own."""
    save_one(99, flush=True)
    assert not RegionOutbox.objects.exists()
    calls.reset()


def test_saving_one_row_without_flush(warm, calls):
    written, after = save_one(1, flush=False)
    assert len(written) == WRITE[LEG], written
    assert after == []  # left to the drain: nothing after the commit
    assert RegionOutbox.objects.count() == 1 and calls.calls == []


def test_a_synchronous_flush_of_one_message(warm, calls):
    written, flushed = save_one(1, flush=True)
    assert len(written) == WRITE[LEG], written
    assert len(flushed) == FLUSH[LEG], flushed
    assert not RegionOutbox.objects.exists() and len(calls.calls) == 1
