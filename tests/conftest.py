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
def scratch_registry():
    """Undo registrations made by a test's own scope and category enums."""
    from outbox.categories import registry

    saved = (dict(registry.scopes), dict(registry.categories), dict(registry._scope_of))
    yield
    registry.scopes, registry.categories, registry._scope_of = saved
