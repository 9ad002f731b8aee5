"""A receiver's exception text reaches the log and the commands' output as one escaped,
bounded line: a newline in it cannot forge a log line, an ESC cannot reach a terminal,
a huge message cannot make a huge record (security review, issue 49, finding 9). The
database keeps the text as it was (already bounded)."""

import logging
from io import StringIO

import pytest
from django.core.management import call_command

from outbox.engine import drain_outboxes
from outbox.models import RegionOutbox
from outbox.shown_text import one_line
from tests.conftest import committing
from tests.factories import RegionOutboxFactory

pytestmark = committing

RECORD = "tests.testapp.receivers.record"
# ESC on the message's first line and on the forged one.
FORGED = "x\x1b[2J\nINFO forged line\x1b[31m"
ESCAPED = "x\\x1b[2J\\nINFO forged line\\x1b[31m"
TRACEBACK_LIMIT = 20_000


def raising(text):
    def receiver_fails(sender, kwargs):
        raise ValueError(text)

    return receiver_fails


def failure_record(caplog):
    [record] = [r for r in caplog.records if getattr(r, "event", "") == "outbox.delivery_failed"]
    return record


def plainly(record):
    """The record as a plain `logging.Formatter` writes it."""
    return logging.Formatter("%(levelname)s %(name)s %(message)s").format(record)


def drain_failing(calls, caplog, text):
    calls.during_call = raising(text)
    RegionOutboxFactory(shard_identifier=4, object_identifier=9)
    with caplog.at_level(logging.WARNING, logger="outbox.engine"):
        assert drain_outboxes().failures == 1


def test_a_forged_line_and_escapes_in_a_receiver_error_stay_one_escaped_line(calls, caplog):
    drain_failing(calls, caplog, FORGED)
    record = failure_record(caplog)
    formatted = plainly(record)
    lines = formatted.splitlines()
    assert "\x1b" not in formatted and "\x1b" not in caplog.text
    assert not any(line.startswith("INFO forged") for line in lines)
    # The message: one line, naming the shard and the receiver, ending with the error.
    assert len(record.getMessage().splitlines()) == 1
    assert lines[0].startswith("WARNING outbox.engine outbox receiver failed for message ")
    assert lines[0].endswith(
        "shard ORGANIZATION/4 category AUDIT_EVENT object 9 (attempt 1), will retry: "
        f"{RECORD}: ValueError: {ESCAPED}"
    )
    # Then the traceback, its last line the exception, escaped as well.
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == f"ValueError: {ESCAPED}"
    assert [line for line in lines if "forged" in line] == [lines[0], lines[-1]]
    # The exception itself still goes with the record, for handlers that want it.
    assert record.exc_info is not None and str(record.exc_info[1]) == FORGED
    # The database keeps the text as the receiver raised it.
    row = RegionOutbox.objects.get()
    assert row.last_error == f"{RECORD}: ValueError: {FORGED}"
    assert row.last_traceback.endswith(f"ValueError: {FORGED}\n")


def test_a_huge_receiver_error_makes_a_bounded_log_record_with_a_visible_cut(calls, caplog):
    drain_failing(calls, caplog, "m" * 900_000)
    formatted = plainly(failure_record(caplog))
    assert len(formatted) < 5_000 + TRACEBACK_LIMIT
    assert "… [cut 899," in formatted.splitlines()[0]
    assert formatted.splitlines()[-1].endswith("m… [cut 899,012 characters]")


def test_a_receiver_error_in_a_long_chain_is_escaped_in_each_exception(calls, caplog):
    def receiver_fails(sender, kwargs):
        try:
            raise KeyError("inner\nINFO forged inner\x1b[31m")
        except KeyError as error:
            raise ValueError("outer\nINFO forged outer") from error

    calls.during_call = receiver_fails
    RegionOutboxFactory(shard_identifier=4, object_identifier=9)
    with caplog.at_level(logging.WARNING, logger="outbox.engine"):
        drain_outboxes()
    lines = plainly(failure_record(caplog)).splitlines()
    assert not any(line.startswith("INFO forged") or "\x1b" in line for line in lines)
    assert "KeyError: 'inner\\nINFO forged inner\\x1b[31m'" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1] == "ValueError: outer\\nINFO forged outer"


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_outbox_status_shows_a_receiver_error_escaped_on_its_line(calls, caplog):
    drain_failing(calls, caplog, FORGED)
    text = run("outbox_status")
    assert "\x1b" not in text
    assert not any(line.startswith("INFO forged") for line in text.splitlines())
    assert f"1 attempts: {RECORD}: ValueError: {ESCAPED}" in text


@pytest.mark.parametrize("grouped", [False, True], ids=["list", "list --group"])
def test_outbox_dead_letters_shows_a_receiver_error_escaped_on_its_line(
    calls, caplog, settings, grouped
):
    settings.OUTBOX_MAX_ATTEMPTS = 1
    calls.during_call = raising(FORGED)
    RegionOutboxFactory(shard_identifier=4, object_identifier=9)
    assert drain_outboxes().dead_lettered == 1
    text = run("outbox_dead_letters", "list", *(["--group"] if grouped else []))
    assert "\x1b" not in text
    assert not any(line.startswith("INFO forged") for line in text.splitlines())
    assert f"{RECORD}: ValueError: x\\x1b[" in text


def test_outbox_status_cuts_a_long_error_with_a_marker(calls, caplog):
    drain_failing(calls, caplog, "m" * 5_000)
    worst = [line for line in run("outbox_status").splitlines() if "worst: shard 0/4" in line]
    assert len(worst) == 1 and worst[0].endswith(" characters]") and len(worst[0]) < 400


@pytest.mark.parametrize(
    ("text", "limit", "shown"),
    [
        ("a\r\nb\tc\x00d\x7fe", 100, "a\\r\\nb\\tc\\x00d\\x7fe"),
        # Breaks `str.splitlines` knows beyond \n, and a bidirectional override.
        ("a\x85b\u2028c\u2029d\x1ce", 100, "a\\x85b\\u2028c\\u2029d\\x1ce"),
        ("pay \u202eevil", 100, "pay \\u202eevil"),
        ("café 日本 \\n stays", 100, "café 日本 \\n stays"),
        ("x" * 12, 10, "xxxxxxxxxx… [cut 2 characters]"),
    ],
)
def test_one_line_escapes_every_line_break_and_control_and_marks_a_cut(text, limit, shown):
    assert one_line(text, limit) == shown
    assert len(shown.splitlines()) == 1
