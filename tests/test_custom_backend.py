"""A backend of the project's own, named in `OUTBOX_BACKENDS` and defined outside the
package (tests/custom_backend.py), drains with no edit to `outbox/`; the engine asks
the backend, not a vendor module, which errors to retry and whether to read the
messages' `date_added`; a bad path is a system check error."""

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from outbox.backends import get_backend
from outbox.backends.portable import PortableBackend
from outbox.backends.postgresql import PostgresBackend
from outbox.backends.select import backend_class, listeners, native_class
from outbox.engine import drain_outboxes
from outbox.exceptions import OutboxConfigurationError
from outbox.models import RegionOutbox
from outbox.signals import message_processed
from tests.conftest import committing
from tests.custom_backend import CountingBackend, FlakyBackend
from tests.factories import RegionOutboxFactory

pytestmark = committing

COUNTING = "tests.custom_backend.CountingBackend"


@pytest.fixture(autouse=True)
def fresh_counts():
    CountingBackend.reset()
    FlakyBackend.failures.clear()


def test_a_backend_outside_the_package_drains_every_message():
    for identifier in (1, 2, 3):
        RegionOutboxFactory(shard_identifier=identifier)
    with override_settings(OUTBOX_BACKENDS=[COUNTING]):
        assert type(get_backend("default")) is CountingBackend
        stats = drain_outboxes([RegionOutbox])
    assert (stats.rows_retired, stats.shards) == (3, 3)
    assert not RegionOutbox.objects.exists()
    # Every statement of the drain went through it: claim, read, settle (and the wake).
    assert len(CountingBackend.statements) >= 3
    assert any("DELETE" in sql for sql in CountingBackend.statements)
    assert CountingBackend.reads  # it read the window


def test_it_is_tried_first_and_chosen_when_it_supports_the_database(settings):
    settings.OUTBOX_BACKENDS = [COUNTING, "outbox.backends.postgresql.PostgresBackend"]
    assert backend_class("default") is CountingBackend
    settings.OUTBOX_FAST_PATH = False  # a subclass of the portable path is still tried
    assert backend_class("default") is CountingBackend


def test_the_default_is_todays_choice(settings):
    settings.OUTBOX_FAST_PATH = False
    assert backend_class("default") is PortableBackend
    assert native_class("default") is not CountingBackend
    settings.OUTBOX_FAST_PATH = True
    if connection.vendor == "postgresql":
        assert backend_class("default") is PostgresBackend


def test_the_engine_tells_the_backend_when_to_read_date_added():
    RegionOutboxFactory(shard_identifier=1)
    with override_settings(OUTBOX_BACKENDS=[COUNTING]):
        drain_outboxes([RegionOutbox])
        assert CountingBackend.reads and not any(CountingBackend.reads)
        RegionOutboxFactory(shard_identifier=2)
        lags = []

        def processed(sender, lag_seconds=None, **kwargs):
            lags.append(lag_seconds)

        message_processed.connect(processed, sender=RegionOutbox, weak=False)
        try:
            drain_outboxes([RegionOutbox])
        finally:
            message_processed.disconnect(processed, sender=RegionOutbox)
    assert CountingBackend.reads[-1] is True
    assert lags and lags[0] is not None


def test_the_backend_says_which_errors_the_engine_retries():
    RegionOutboxFactory(shard_identifier=1)
    with override_settings(OUTBOX_BACKENDS=["tests.custom_backend.FlakyBackend"]):
        stats = drain_outboxes([RegionOutbox])
    assert FlakyBackend.failures == [1]  # the first claim failed, and was retried
    assert stats.rows_retired == 1
    # The contract walks the causes, as a driver error wrapped by Django would be.
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = ValueError("not a lock error")
    assert not FlakyBackend.is_transient(wrapped)
    assert not PortableBackend.is_transient(ValueError("no"))


def test_a_database_without_a_listener_only_polls(settings):
    settings.OUTBOX_BACKENDS = [COUNTING]
    assert listeners(None, None) == {}


def check_ids(settings_value, settings):
    settings.OUTBOX_BACKENDS = settings_value
    return [message.id for message in checks.run_checks() if message.id.startswith("outbox.")]


def test_a_path_that_does_not_import_or_is_no_backend_is_a_check_error(settings):
    assert "outbox.E022" not in check_ids([COUNTING], settings)
    assert check_ids(["tests.custom_backend.Missing"], settings).count("outbox.E022") == 1
    bad = ["tests.custom_backend.NOT_A_BACKEND", "outbox.models.RegionOutbox", COUNTING]
    assert check_ids(bad, settings).count("outbox.E022") == 2
    assert "outbox.E011" in check_ids("tests.custom_backend.CountingBackend", settings)
    assert "outbox.E012" in check_ids([], settings)
    settings.OUTBOX_BACKENDS = ["tests.custom_backend.Missing"]
    with pytest.raises(OutboxConfigurationError, match="cannot be imported"):
        get_backend("default")
