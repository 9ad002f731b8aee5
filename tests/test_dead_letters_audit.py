"""The audit of dead letters handled from the command line (#46 finding 5):
`outbox_dead_letters retry|discard` write the admin log as the admin's actions do, one
entry per dead letter under the user `--user` names (by default the user named as the
OS login name), and an unknown user is refused before anything changes. A revived dead
letter keeps its history: when it was first and last attempted, its last error."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

import outbox.models.audit as audit
from outbox.engine import drain_outboxes
from outbox.models import ControlOutbox, RegionOutbox, ShardLease
from outbox.models.causes import cause_of
from tests.conftest import committing
from tests.factories import ControlOutboxFactory, RegionOutboxFactory
from tests.test_admin import post_action
from tests.testapp.categories import Category

pytestmark = committing

BY_COMMAND = "by outbox_dead_letters"
REVIVED = f"Retried now (a dead letter, revived) {BY_COMMAND}"
DISCARDED = f"Discarded {BY_COMMAND}"


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("operator", password="pw", is_staff=True)


@pytest.fixture
def login(monkeypatch):
    """Set the OS login name the command reads (None: the process has none)."""

    def set_login(name):
        def getuser():
            if name is None:
                raise OSError("No username set for the current user")
            return name

        monkeypatch.setattr("getpass.getuser", getuser)

    set_login("nobody-here")
    return set_login


def dead_letter(shard_identifier=1, error="RuntimeError: the CRM answered 503", **fields):
    """A dead letter as the engine leaves it: attempts used up, first and last attempt
    times, the last error and traceback."""
    now = timezone.now()
    return RegionOutboxFactory(
        shard_identifier=shard_identifier,
        attempts=3,
        first_attempt_at=now - timedelta(hours=2),
        last_attempt_at=now - timedelta(minutes=5),
        dead_at=now - timedelta(minutes=5),
        last_error=error,
        last_traceback="Traceback (most recent call last):\n  crm.py",
        **fields,
    )


def run(*args):
    out, err = StringIO(), StringIO()
    call_command("outbox_dead_letters", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def entries(model=RegionOutbox):
    """The admin log entries of `model`'s messages: (user, object id, flag, message)."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    logged = LogEntry.objects.filter(content_type=content_type).order_by("pk")
    return [
        (entry.user.username, entry.object_id, entry.action_flag, entry.get_change_message())
        for entry in logged
    ]


def said(row, did, shard=None, category="AUDIT_EVENT"):
    shard = shard or f"ORGANIZATION/{row.shard_identifier}"
    return f"{did}: message {row.message_id}, shard {shard}, category {category}."


def history(row):
    """What a row's admin History page shows: its fields as the database holds them."""
    row.refresh_from_db()
    return (row.first_attempt_at, row.last_attempt_at, row.last_error, row.last_traceback)


def test_retry_logs_one_entry_per_dead_letter_under_the_named_user(operator):
    first = dead_letter(1)
    second = dead_letter(2, category=Category.LEDGER_ENTRY)
    pending = RegionOutboxFactory(shard_identifier=1)
    out, err = run("retry", "--all", "--user", "operator")
    assert (out, err) == ("Retried 2 dead letter(s).\n", "")
    assert entries() == [
        ("operator", str(first.pk), CHANGE, said(first, REVIVED)),
        ("operator", str(second.pk), CHANGE, said(second, REVIVED, category="LEDGER_ENTRY")),
    ]
    entry = LogEntry.objects.get(object_id=str(first.pk))
    assert entry.object_repr == str(first) and entry.user == operator
    assert not RegionOutbox.objects.dead().exists()
    assert str(pending.pk) not in [object_id for _, object_id, *_ in entries()]


def test_discard_logs_one_entry_per_dead_letter_deleted(operator):
    first = dead_letter(1)
    kept = dead_letter(2)
    out, _ = run("discard", "--shard", "1", "--user", "operator")
    assert out == "Discarded 1 dead letter(s).\n"
    assert entries() == [("operator", str(first.pk), DELETION, said(first, DISCARDED))]
    assert list(RegionOutbox.objects.values_list("pk", flat=True)) == [kept.pk]


def test_the_entries_name_the_cause_a_retry_selected(operator):
    crm = dead_letter(1, error="app.receivers.sync: RuntimeError: the CRM answered 503")
    mail = dead_letter(2, error="app.receivers.mail: KeyError: 'email'")
    also_crm = dead_letter(3, error="app.receivers.sync: RuntimeError: the CRM answered 504")
    crm_key, mail_key = cause_of(crm.last_error).key, cause_of(mail.last_error).key
    assert cause_of(also_crm.last_error).key == crm_key
    out, _ = run("retry", "--cause", mail_key, "--cause", crm_key, "--user", "operator")
    assert out == "Retried 3 dead letter(s).\n"
    by_cause = f"{REVIVED} as a dead letter of cause"
    assert entries() == [
        ("operator", str(mail.pk), CHANGE, said(mail, f"{by_cause} {mail_key}")),
        ("operator", str(crm.pk), CHANGE, said(crm, f"{by_cause} {crm_key}")),
        ("operator", str(also_crm.pk), CHANGE, said(also_crm, f"{by_cause} {crm_key}")),
    ]


def test_dead_letters_are_read_and_logged_chunk_by_chunk(operator, monkeypatch):
    monkeypatch.setattr(audit, "CHUNK_ROWS", 2)
    rows = [dead_letter(shard) for shard in range(5)]
    assert run("discard", "--all", "--user", "operator")[0] == "Discarded 5 dead letter(s).\n"
    assert entries() == [("operator", str(row.pk), DELETION, said(row, DISCARDED)) for row in rows]
    assert not RegionOutbox.objects.exists()


def test_a_table_on_another_database_is_logged_too(operator):
    """ControlOutbox lives on the "control" database, the admin log on "default"."""
    row = ControlOutboxFactory(attempts=2, dead_at=timezone.now(), first_attempt_at=timezone.now())
    before = history(row)
    out, _ = run("retry", "--table", "outbox.ControlOutbox", "--all", "--user", "operator")
    assert out == "Retried 1 dead letter(s).\n"
    revived = f"{REVIVED}: message {row.message_id}, shard us/USER/1, category USER_UPDATE."
    assert entries(ControlOutbox) == [("operator", str(row.pk), CHANGE, revived)]
    assert history(row) == before and row.dead_at is None


@pytest.mark.parametrize("verb", ["retry", "discard"])
def test_an_unknown_user_is_refused_before_anything_changes(verb, operator):
    row = dead_letter(1)
    with pytest.raises(CommandError, match=r"--user: no user has the username 'nobody'"):
        run(verb, "--all", "--user", "nobody")
    assert RegionOutbox.objects.dead().get().pk == row.pk
    assert not LogEntry.objects.exists()


def test_the_user_is_for_retry_and_discard_only(operator):
    with pytest.raises(CommandError, match="--user and --no-audit go with retry or discard"):
        run("list", "--user", "operator")
    with pytest.raises(CommandError, match="not allowed with argument"):
        run("retry", "--all", "--user", "operator", "--no-audit")


def test_by_default_the_user_named_as_the_login_name(django_user_model, login):
    django_user_model.objects.create_user("alice")
    login("alice")
    row = dead_letter(1)
    out, err = run("retry", "--id", str(row.pk))
    assert (out, err) == ("Retried 1 dead letter(s).\n", "")
    assert entries() == [("alice", str(row.pk), CHANGE, said(row, REVIVED))]


@pytest.mark.parametrize(
    ("name", "whose"),
    [("root", "no user has your login name 'root'"), (None, "you have no login name")],
)
def test_without_a_user_to_name_the_command_acts_and_warns(operator, login, name, whose):
    login(name)
    row = dead_letter(1)
    out, err = run("retry", "--id", str(row.pk))
    assert out == "Retried 1 dead letter(s).\n"
    assert f"No admin log entry will be written: no --user given, and {whose}." in err
    assert "--user USERNAME, or say --no-audit" in err
    assert not RegionOutbox.objects.dead().exists() and not LogEntry.objects.exists()


def test_no_audit_writes_no_entry_and_says_nothing(operator, login):
    login("operator")  # even where the login name names a user
    dead_letter(1)
    assert run("discard", "--all", "--no-audit") == ("Discarded 1 dead letter(s).\n", "")
    assert not RegionOutbox.objects.exists() and not LogEntry.objects.exists()


def test_a_retry_from_the_command_keeps_the_history(operator):
    row = dead_letter(1)
    before = history(row)
    run("retry", "--id", str(row.pk), "--user", "operator")
    assert history(row) == before
    assert (row.dead_at, row.attempts) == (None, 0) and row.scheduled_for <= timezone.now()


def test_a_retry_without_an_audit_keeps_the_history_too(operator):
    row = dead_letter(1)
    before = history(row)
    run("retry", "--all", "--no-audit")
    assert history(row) == before and row.dead_at is None
    again = dead_letter(2)
    before = history(again)
    assert again.retry_dead() and history(again) == before


def test_a_retry_from_the_admin_keeps_the_history(admin_client):
    row = dead_letter(1)
    before = history(row)
    post_action(admin_client, "retry_messages", [row])
    assert history(row) == before
    assert (row.dead_at, row.attempts) == (None, 0)


def test_a_revived_message_that_fails_again_keeps_its_first_attempt(operator, calls, settings):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.failing = {1}
    row = RegionOutboxFactory(shard_identifier=1)
    drain_outboxes()
    first, last, error, _ = history(row)
    assert row.dead_at is not None and first is not None and "receiver failed" in error
    run("retry", "--id", str(row.pk), "--user", "operator")
    ShardLease.objects.all().delete()
    assert drain_outboxes().dead_lettered == 1
    again = history(row)
    assert again[0] == first and again[1] >= last and row.attempts == 1
    # The row's History page lists the revival, by whom.
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert (entry.user, entry.get_change_message()) == (operator, said(row, REVIVED))


def test_the_history_page_lists_the_commands_entry(admin_client, operator):
    row = dead_letter(1)
    run("retry", "--id", str(row.pk), "--user", "operator")
    page = admin_client.get(reverse("admin:outbox_regionoutbox_history", args=[row.pk]))
    assert page.status_code == 200
    assert said(row, REVIVED).encode() in page.content
    assert b"operator" in page.content
