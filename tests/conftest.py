import pytest
from django.conf import settings

from tests.testapp.receivers import recorder

# Tests that commit for real: the engine refuses to drain inside the test's transaction.
committing = pytest.mark.django_db(transaction=True, databases=["default", "control"])

server_database_only = pytest.mark.skipif(
    settings.TEST_DB == "sqlite", reason="real concurrency needs PostgreSQL or MariaDB"
)


@pytest.fixture(autouse=True)
def calls():
    """The recorder every test receiver reports to, fresh for each test."""
    recorder.reset()
    yield recorder
    recorder.reset()


@pytest.fixture
def backlog(settings):
    """One-message shards 0..n-1, claimed in batches of 10: from the second full batch
    a drain settles behind and, from the third, works on batches claimed ahead
    (`outbox.engine.pipeline`). Fast paths only."""
    from outbox.backends import get_backend
    from outbox.models import RegionOutbox
    from tests.factories import RegionOutboxFactory

    if not get_backend("default").settles_behind:
        pytest.skip("the portable path settles and claims every batch itself")
    settings.OUTBOX_BATCH_SHARDS = 10
    settings.OUTBOX_BATCH_ROWS = 10

    def write(shards):
        RegionOutbox.objects.bulk_create(
            [
                RegionOutboxFactory.build(shard_identifier=n, object_identifier=n)
                for n in range(shards)
            ]
        )

    return write


@pytest.fixture
def scratch_registry():
    """Undo registrations made by a test's own scope and category enums."""
    from outbox.categories import registry

    saved = (
        dict(registry.scopes),
        dict(registry.categories),
        dict(registry.declared),
        dict(registry._scope_of),
    )
    yield
    registry.scopes, registry.categories, registry.declared, registry._scope_of = saved
