"""How many of the package's modules one message crosses, from `save()` in an
`outbox_context` through the commit, the synchronous flush, the receiver and the settle
(issue #45 asks for at most 12). Measured by the modules whose functions run, with a
profiler hook, on a second message (the first one warms the caches up). The ceiling is
a ratchet at today's figure per database: the path must not grow unseen; lower it as
modules are merged."""

import sys

from django.db import connection, transaction

from outbox import outbox_context
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.testapp.categories import Category, Scope

pytestmark = committing

# Modules crossed on 2026-12-03, per database vendor (PostgreSQL's fast path 15, its
# portable path 16; MariaDB's fast path 15, its portable path 16; SQLite 16), one more
# for what an environment adds (an installed extra, another Django); the goal is 12.
CEILING = {"postgresql": 17, "mysql": 17, "sqlite": 17}


def modules_crossed(identifier: int) -> set[str]:
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith("outbox"):
                seen.add(module)

    sys.setprofile(profile)
    try:
        with outbox_context(transaction.atomic()):
            RegionOutbox.objects.create(
                shard_scope=Scope.ORGANIZATION,
                shard_identifier=identifier,
                category=Category.ORGANIZATION_UPDATE,
                object_identifier=1,
                payload={"n": identifier},
            )
    finally:
        sys.setprofile(None)
    return seen


def test_one_message_crosses_no_more_modules_than_it_did(calls):
    modules_crossed(1)
    crossed = modules_crossed(2)
    assert len(calls.payloads()) == 2  # delivered by the flush after each commit
    print(f"{len(crossed)} modules on {connection.vendor}:", ", ".join(sorted(crossed)))
    assert len(crossed) <= CEILING[connection.vendor], sorted(crossed)
