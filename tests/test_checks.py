from contextlib import contextmanager

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outbox.checks import check_receivers, check_receivers_deployed
from outbox.signals import process_region_outbox
from tests.testapp.categories import Category
from tests.testapp.receivers import record


@contextmanager
def audit_events_unreceived():
    process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
    try:
        yield
    finally:
        process_region_outbox.connect(record, sender=Category.AUDIT_EVENT)


def test_every_category_has_a_receiver():
    assert check_receivers() == []
    assert check_receivers_deployed() == []


def test_category_without_receiver_is_a_warning_by_default():
    # A project under construction, and the quick start, can still migrate.
    with audit_events_unreceived():
        messages = check_receivers()
    assert [(type(m), m.id) for m in messages] == [(Warning, "outbox.W001")]
    assert "Category.AUDIT_EVENT (tests.testapp.categories) has no receiver" in messages[0].msg
    assert "sender=Category.AUDIT_EVENT" in messages[0].hint
    assert "an error (outbox.E001) under check --deploy" in messages[0].hint


def test_category_without_receiver_is_an_error_under_deploy():
    with audit_events_unreceived():
        messages = check_receivers_deployed()
    assert [(type(m), m.id) for m in messages] == [(Error, "outbox.E001")]
    assert "Category.AUDIT_EVENT" in messages[0].msg


def test_manage_py_check_passes_with_the_warning_and_fails_where_asked():
    with audit_events_unreceived():
        call_command("check", "--tag", "signals")  # a warning: migrate still runs
        with pytest.raises(SystemCheckError, match=r"outbox\.W001"):
            call_command("check", "--tag", "signals", "--fail-level", "WARNING")
        with pytest.raises(SystemCheckError, match=r"outbox\.E001"):
            call_command("check", "--tag", "signals", "--deploy")
    call_command("check", "--tag", "signals", "--deploy", "--fail-level", "WARNING")
