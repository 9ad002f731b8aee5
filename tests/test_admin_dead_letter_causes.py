"""The admin's page of dead letters by cause: reachable from the change list, a retry and
a discard per cause with the permissions of the change list's actions, the admin log."""

import pytest
from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import outbox.admin.dead_letter_causes as causes
from outbox.models import ControlOutbox, RegionOutbox
from outbox.models.causes import cause_of
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.test_admin import shown, staff
from tests.testapp.categories import Category

pytestmark = committing

PAGE = "admin:outbox_regionoutbox_causes"
RECORD = "tests.testapp.receivers.record"
DOWN = f"{RECORD}: RuntimeError: the CRM answered 503 for order 17"


def dead_letter(error=DOWN, shard_identifier=1, **fields):
    return RegionOutboxFactory(
        shard_identifier=shard_identifier,
        attempts=3,
        dead_at=timezone.now(),
        last_error=error,
        **fields,
    )


def causes_shown(page):
    return [(group.key, group.count) for group in page.context["grouping"].groups]


@pytest.fixture
def two_causes():
    down = [dead_letter(DOWN.replace("17", str(n)), n) for n in (1, 2, 3)]
    missing = dead_letter(f"{RECORD}: KeyError: 'name'", 4, category=Category.ORGANIZATION_UPDATE)
    RegionOutboxFactory(shard_identifier=5)  # pending: no cause
    return down, missing


def test_the_change_list_links_to_the_page_of_causes(admin_client, two_causes):
    changelist = admin_client.get(reverse("admin:outbox_regionoutbox_changelist"))
    assert reverse(PAGE).encode() in changelist.content
    down, missing = two_causes
    page = admin_client.get(reverse(PAGE))
    assert page.status_code == 200
    key = cause_of(DOWN).key
    assert causes_shown(page) == [(key, 3), (cause_of(missing.last_error).key, 1)]
    html = page.content.decode()
    assert f'data-cause="{key}"' in html
    assert "the CRM answered &lt;n&gt; for order &lt;n&gt;" in html
    assert reverse("admin:outbox_regionoutbox_change", args=[down[0].pk]) in html
    assert "Retry 3" in html and "Discard 3" in html


def test_a_view_only_user_sees_the_causes_and_no_button_and_a_forged_post_is_refused(
    django_user_model, two_causes
):
    viewer = staff(django_user_model, "viewer", "view_regionoutbox")
    page = viewer.get(reverse(PAGE))
    assert page.status_code == 200 and len(causes_shown(page)) == 2
    assert b'name="verb"' not in page.content
    for verb in ("retry", "discard"):
        forged = viewer.post(reverse(PAGE), {"verb": verb, "cause": cause_of(DOWN).key})
        assert forged.status_code == 403
    assert RegionOutbox.objects.dead().count() == 4
    nobody = staff(django_user_model, "nobody")
    assert nobody.get(reverse(PAGE)).status_code == 403


def test_retry_needs_the_change_permission_and_revives_only_its_cause(
    django_user_model, two_causes
):
    down, missing = two_causes
    retrier = staff(django_user_model, "retrier", "view_regionoutbox", "change_regionoutbox")
    page = retrier.get(reverse(PAGE))
    assert b'value="retry"' in page.content and b'value="discard"' not in page.content
    key = cause_of(DOWN).key
    refused = retrier.post(reverse(PAGE), {"verb": "discard", "cause": key})
    assert refused.status_code == 403 and RegionOutbox.objects.dead().count() == 4
    done = retrier.post(reverse(PAGE), {"verb": "retry", "cause": key}, follow=True)
    assert (messages.SUCCESS, f"Retried the dead letters of cause {key}: 3 message(s), 0 "
            "back-off(s) lifted.") in shown(done)  # fmt: skip
    assert list(RegionOutbox.objects.dead()) == [missing]
    assert all(
        row.attempts == 0 for row in RegionOutbox.objects.filter(pk__in=[r.pk for r in down])
    )
    assert causes_shown(done) == [(cause_of(missing.last_error).key, 1)]
    revived = {str(row.pk) for row in down}
    [summary] = LogEntry.objects.exclude(object_id__in=revived)
    assert summary.action_flag == CHANGE and key in summary.change_message
    per_message = LogEntry.objects.filter(object_id__in=revived)
    assert {entry.object_id for entry in per_message} == revived  # one per message
    assert all(
        entry.action_flag == CHANGE and f"as a dead letter of cause {key}:" in entry.change_message
        for entry in per_message
    )


def test_discard_needs_the_delete_permission_and_deletes_only_its_cause(
    django_user_model, two_causes
):
    _, missing = two_causes
    discarder = staff(django_user_model, "discarder", "view_regionoutbox", "delete_regionoutbox")
    key = cause_of(missing.last_error).key
    assert discarder.post(reverse(PAGE), {"verb": "retry", "cause": key}).status_code == 403
    done = discarder.post(reverse(PAGE), {"verb": "discard", "cause": key}, follow=True)
    assert (messages.SUCCESS, f"Discarded the dead letters of cause {key}: 1 message(s).") in shown(
        done
    )
    assert not RegionOutbox.objects.filter(pk=missing.pk).exists()
    assert RegionOutbox.objects.dead().count() == 3
    entries = LogEntry.objects.all()
    assert {entry.action_flag for entry in entries} == {DELETION}
    assert str(missing.pk) in {entry.object_id for entry in entries}  # its own entry


def test_a_click_handles_a_bounded_number_and_says_what_is_left(
    admin_client, monkeypatch, two_causes
):
    monkeypatch.setattr(causes, "MAX_CAUSE_ROWS", 2)
    key = cause_of(DOWN).key
    done = admin_client.post(reverse(PAGE), {"verb": "retry", "cause": key}, follow=True)
    assert (
        messages.WARNING,
        f"Only the first 2 dead letters of cause {key} were handled: do it again for the rest.",
    ) in shown(done)
    assert causes_shown(done)[0] == (key, 1)
    gone = admin_client.post(reverse(PAGE), {"verb": "retry", "cause": "0" * 12}, follow=True)
    assert (messages.WARNING, f"No dead letter of cause {'0' * 12} left.") in shown(gone)
    bad = admin_client.post(reverse(PAGE), {"verb": "retry", "cause": "nope"}, follow=True)
    assert (messages.ERROR, "'nope' is not a cause.") in shown(bad)


def test_control_outbox_causes_work_on_its_own_database(admin_client):
    ControlOutboxFactory.create_batch(2, dead_at=timezone.now(), attempts=1, last_error=DOWN)
    page_url = reverse("admin:outbox_controloutbox_causes")
    page = admin_client.get(page_url)
    assert causes_shown(page) == [(cause_of(DOWN).key, 2)]
    admin_client.post(page_url, {"verb": "discard", "cause": cause_of(DOWN).key})
    assert not ControlOutbox.objects.exists()


def test_the_page_costs_the_same_queries_for_few_or_many_dead_letters(admin_client):
    def queries_for_page():
        with CaptureQueriesContext(connections["default"]) as queries:
            assert admin_client.get(reverse(PAGE)).status_code == 200
        return len(queries)

    for n in range(3):
        dead_letter(DOWN.replace("17", str(n)), n)
    few = queries_for_page()
    for n in range(3, 40):
        dead_letter(DOWN.replace("17", str(n)) if n % 2 else f"{RECORD}: KeyError: '{n}'", n)
    assert queries_for_page() == few
