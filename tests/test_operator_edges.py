"""The edges an operator found inconsistent (#35 item 8): the health check function and
`outbox_status` refuse the same bad input the same way, and the operating guide's
logging table names the events the code logs, at the levels it logs them."""

import ast
import io
import logging
import math
import re
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError

from outbox import exceptions
from outbox.engine import drain_outboxes
from outbox.health import Thresholds, backlog, check, statuses
from outbox.health.snapshot import table_status
from outbox.models import RegionOutbox
from outbox.writes.context import _FAILURE_MESSAGES
from tests.conftest import committing

ROOT = Path(__file__).resolve().parent.parent
OPERATING = ROOT / "docs" / "howto" / "operating.md"
LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARNING", "error": "ERROR"}
LEVELS["exception"] = "ERROR"


# (a) An unknown database alias -------------------------------------------------------


def command_error(*args):
    with pytest.raises(CommandError) as refused:
        call_command("outbox_status", *args, stdout=io.StringIO())
    return refused.value


@pytest.mark.parametrize(
    "read",
    [
        lambda: check(using="nosuch"),
        lambda: check("nosuch", Thresholds(max_dead=0)),
        lambda: statuses("nosuch"),
        lambda: backlog("nosuch"),
        lambda: table_status(RegionOutbox, "nosuch"),
    ],
    ids=["check", "check-thresholds", "statuses", "backlog", "table_status"],
)
def test_an_unknown_database_is_the_commands_error_as_an_outbox_error(read):
    with pytest.raises(exceptions.OutboxError) as refused:
        read()
    assert type(refused.value).__name__ == "UnknownDatabase"
    assert isinstance(refused.value, exceptions.UnknownDatabase)
    message = str(refused.value)
    assert "'nosuch'" in message
    assert all(repr(alias) in message for alias in django_settings.DATABASES)
    # The same words `outbox_status --database nosuch` gives.
    assert message == str(command_error("--database", "nosuch"))


def test_unknown_database_still_catches_as_djangos_connection_error():
    from django.utils.connection import ConnectionDoesNotExist

    with pytest.raises(ConnectionDoesNotExist):
        check(using="nosuch")


# (b) Thresholds that can never be met, or are no numbers --------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_lag_seconds": -1},
        {"max_lag_seconds": -0.5},
        {"max_lag_seconds": math.nan},
        {"max_lag_seconds": "300"},
        {"max_lag_seconds": True},
        {"max_dead": -1},
        {"max_dead": "0"},
        {"max_dead": 1.5},
        {"max_dead": False},
        {"max_expired": -3},
        {"max_expired": [1]},
    ],
    ids=repr,
)
def test_a_negative_or_non_numeric_threshold_is_refused_when_made(kwargs):
    [(name, value)] = kwargs.items()
    with pytest.raises(exceptions.OutboxError) as refused:
        Thresholds(**kwargs)
    assert isinstance(refused.value, ValueError)
    assert type(refused.value).__name__ == "InvalidThreshold"
    assert name in str(refused.value) and repr(value) in str(refused.value)


def test_sound_thresholds_are_kept():
    assert Thresholds(0, 0, 0) == Thresholds(max_lag_seconds=0, max_dead=0, max_expired=0)
    assert Thresholds(max_lag_seconds=0.5).max_lag_seconds == 0.5
    assert Thresholds(max_lag_seconds=math.inf).max_lag_seconds == math.inf
    assert Thresholds(300, 2, 1) == Thresholds(300, 2, 1)
    assert Thresholds() == Thresholds(None, None, None)


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-lag", "-1"], "--max-lag must not be negative"),
        (["--max-dead", "-1"], "--max-dead must not be negative"),
        (["--max-expired", "-2"], "--max-expired must not be negative"),
        (["--max-lag", "nan"], "max_lag_seconds must be a number"),
        (["--max-lag", "soon"], "invalid float value: 'soon'"),
        (["--max-dead", "1.5"], "invalid int value: '1.5'"),
    ],
)
def test_the_command_refuses_them_as_a_command_error(args, words):
    refused = command_error(*args)
    assert words in str(refused)
    assert refused.returncode == 1  # a command error, not "unhealthy" (6)


# (c) The logging table of the operating guide --------------------------------------


def logging_table():
    """{event: (logger, level)} from the rows of the guide's logging table."""
    text = OPERATING.read_text()
    section = text.split("## Logs and lifecycle signals", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 4 or not cells[1].startswith("`outbox."):
            continue
        event = cells[1].strip("`")
        assert event not in rows, f"{event} has two rows"
        rows[event] = (cells[0].strip("`"), cells[2])
    return rows


@committing
def test_a_failed_and_a_dead_lettered_delivery_log_the_events_the_guide_names(
    calls, settings, caplog
):
    settings.OUTBOX_MAX_ATTEMPTS = 2
    from tests.test_dead_letters import make_due, poison_and_followers

    poison_and_followers(calls)
    with caplog.at_level(logging.INFO, logger="outbox"):
        assert drain_outboxes().failures == 1
        make_due()
        assert drain_outboxes().dead_lettered == 1
    logged = [
        (record.name, record.event, record.levelname)
        for record in caplog.records
        if getattr(record, "event", "") in ("outbox.delivery_failed", "outbox.dead_lettered")
    ]
    assert logged == [
        ("outbox.engine", "outbox.delivery_failed", "WARNING"),
        ("outbox.engine", "outbox.dead_lettered", "ERROR"),
    ]
    table = logging_table()
    for logger, event, level in logged:
        assert table.get(event) == (logger, level), f"{event}: the guide says {table.get(event)}"


def logged_events():
    """{event: (logger, level or None)} of every log call under outbox/ whose `extra`
    names an event; None where the level is decided at run time (`logger.log`)."""
    found = {}
    for path in sorted((ROOT / "outbox").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = re.findall(r'getLogger\("([\w.]+)"\)', path.read_text())
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
            if not isinstance(extra, ast.Dict) or not names:
                continue
            for key, value in zip(extra.keys, extra.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "event":
                    events = [
                        node.value
                        for node in ast.walk(value)
                        if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    ] or list(_FAILURE_MESSAGES)  # pending.py: the event is a key of these
                    for event in events:
                        found[event] = (names[0], LEVELS.get(call.func.attr))
    return found


def test_the_guide_has_one_row_per_event_the_code_logs_at_its_level():
    code, table = logged_events(), logging_table()
    assert "outbox.dead_lettered" in code and "outbox.flush_failed" in code  # found them
    assert sorted(table) == sorted(code)
    for event, (logger, level) in code.items():
        assert table[event][0] == logger, event
        if level is not None:
            assert table[event][1] == level, event
