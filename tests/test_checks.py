from contextlib import contextmanager

import pytest
from django.core.checks import ERROR, WARNING, Tags, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outbox.checks.declarations import check_receivers
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


def receiver_checks(*, deploy):
    """The receiver checks' messages of one run, as `manage.py check [--deploy]` runs them."""
    return run_checks(tags=[Tags.signals], include_deployment_checks=deploy)


def test_every_category_has_a_receiver():
    assert check_receivers() == []
    assert receiver_checks(deploy=False) == receiver_checks(deploy=True) == []


def test_category_without_receiver_is_a_warning_by_default():
    # A project under construction, and the quick start, can still migrate.
    with audit_events_unreceived():
        messages = receiver_checks(deploy=False)
    assert [(m.level, m.id) for m in messages] == [(WARNING, "outbox.W001")]
    assert "Category.AUDIT_EVENT (tests.testapp.categories) has no receiver" in messages[0].msg
    assert "sender=Category.AUDIT_EVENT" in messages[0].hint
    assert "an error (outbox.E001) under check --deploy" in messages[0].hint


def test_category_without_receiver_is_one_error_under_deploy():
    # Once: the error, not the warning as well.
    with audit_events_unreceived():
        messages = receiver_checks(deploy=True)
    assert [(m.level, m.id) for m in messages] == [(ERROR, "outbox.E001")]
    assert "Category.AUDIT_EVENT" in messages[0].msg
    assert "sender=Category.AUDIT_EVENT" in messages[0].hint
    assert "under check --deploy" not in messages[0].hint
    with audit_events_unreceived():  # and a later run without --deploy warns again
        assert [m.id for m in receiver_checks(deploy=False)] == ["outbox.W001"]


def test_manage_py_check_passes_with_the_warning_and_fails_where_asked():
    with audit_events_unreceived():
        call_command("check", "--tag", "signals")  # a warning: migrate still runs
        with pytest.raises(SystemCheckError, match=r"outbox\.W001"):
            call_command("check", "--tag", "signals", "--fail-level", "WARNING")
        with pytest.raises(SystemCheckError, match=r"outbox\.E001") as raised:
            call_command("check", "--tag", "signals", "--deploy")
        assert "outbox.W001" not in str(raised.value)
        assert "1 issue" in str(raised.value)
    call_command("check", "--tag", "signals", "--deploy", "--fail-level", "WARNING")
