"""How many of the package's modules one message crosses, from `save()` in an
`outbox_context` through the commit, the synchronous flush, the receiver and the settle
(issue #45 asks for at most 12). Measured by the modules whose functions run, with a
profiler hook, on a second message (the first one warms the caches up). The ceiling is
a ratchet at today's figure per backend: the path must not grow unseen."""

import sys

from django.db import connection, transaction

from outbox import outbox_context
from outbox.backends.select import backend_class
from outbox.models import RegionOutbox
from tests.conftest import committing
from tests.testapp.categories import Category, Scope

pytestmark = committing

# Modules crossed, per backend: the fast paths 12 (the write path, the model and its
# categories, the settings, the flush's drain, delivery and pipeline, the backend
# selection, contract and fast path, the Django internals, trace context); the portable
# path two more, the lease and pause models its ORM queries go through.
CEILING = {"PostgresBackend": 12, "MariaDBBackend": 12, "PortableBackend": 14}


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
    backend = backend_class(connection.alias).__name__
    print(f"{len(crossed)} modules on {backend}:", ", ".join(sorted(crossed)))
    assert len(crossed) <= CEILING[backend], sorted(crossed)
