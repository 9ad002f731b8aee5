"""Typed settings (outbox.conf) and their system checks (outbox.E010 ... outbox.E017)."""

import math
from pathlib import Path

import django
import pytest
from django.core.checks import run_checks
from django.test import override_settings

from outbox.checks.settings import check_settings
from outbox.conf import SETTINGS, OutboxSettings, Setting, outbox_settings
from outbox.exceptions import OutboxConfigurationError

django6_only = pytest.mark.skipif(django.VERSION < (6,), reason="Django Tasks needs Django 6")


def hook(using, shards):
    """A valid OUTBOX_PROMPT_DRAIN target."""


NOT_CALLABLE = 42


def ids(**overrides):
    with override_settings(**overrides):
        return [error.id for error in check_settings()]


# -- typed access ----------------------------------------------------------------------


def test_access_returns_the_declared_types():
    assert outbox_settings.LEASE_SECONDS == 30.0  # tests/settings.py
    assert type(outbox_settings.LEASE_SECONDS) is float
    assert type(outbox_settings.BATCH_SHARDS) is int
    assert type(outbox_settings.FAST_PATH) is bool
    assert outbox_settings.PROMPT_DRAIN is None
    assert outbox_settings.CELERY_DRAIN_TASK == "outbox.drain"


@override_settings(OUTBOX_LEASE_SECONDS=5, OUTBOX_BATCH_SHARDS=7, OUTBOX_CELERY_QUEUE="q")
def test_access_reflects_override_settings_and_turns_ints_into_floats():
    assert outbox_settings.LEASE_SECONDS == 5.0
    assert type(outbox_settings.LEASE_SECONDS) is float
    assert outbox_settings.BATCH_SHARDS == 7
    assert outbox_settings.CELERY_QUEUE == "q"


def test_access_follows_each_change_of_the_settings(settings):
    settings.OUTBOX_TASK_SHARDS = 3
    assert outbox_settings.TASK_SHARDS == 3
    settings.OUTBOX_TASK_SHARDS = 4
    assert outbox_settings.TASK_SHARDS == 4
    del settings.OUTBOX_TASK_SHARDS
    assert outbox_settings.TASK_SHARDS == 50


@pytest.mark.parametrize(
    ("name", "value"),
    [("BATCH_SHARDS", -1), ("LEASE_SECONDS", "60"), ("FAST_PATH", 1), ("BATCH_ROWS", True)],
)
def test_access_to_a_bad_value_raises_naming_the_setting(name, value):
    with (
        override_settings(**{f"OUTBOX_{name}": value}),
        pytest.raises(OutboxConfigurationError, match=f"^OUTBOX_{name} is {value!r}"),
    ):
        getattr(outbox_settings, name)


def test_a_bad_value_raises_on_every_read_and_a_fixed_one_is_read_again(settings):
    settings.OUTBOX_BATCH_ROWS = 0
    for _ in range(2):  # a value that failed its check is not kept
        with pytest.raises(OutboxConfigurationError, match=r"^OUTBOX_BATCH_ROWS is 0"):
            outbox_settings.BATCH_ROWS  # noqa: B018
    settings.OUTBOX_BATCH_ROWS = 5
    assert outbox_settings.BATCH_ROWS == 5


def test_a_read_value_is_kept_until_a_setting_changes(settings):
    from django.conf import settings as django_settings
    from django.core.signals import setting_changed

    settings.OUTBOX_TASK_SHARDS = 3
    assert outbox_settings.TASK_SHARDS == 3
    # Assigned behind Django's back: no setting_changed, so the kept value stays.
    django_settings.OUTBOX_TASK_SHARDS = 9
    assert outbox_settings.TASK_SHARDS == 3
    # Any OUTBOX_* change announced by Django drops every kept value.
    setting_changed.send(None, setting="OUTBOX_LEASE_SECONDS", value=1, enter=True)
    assert outbox_settings.TASK_SHARDS == 9


def test_unknown_names_are_no_attributes():
    with pytest.raises(AttributeError):
        outbox_settings.BACH_SHARDS  # noqa: B018


def test_settings_lists_every_setting_in_declaration_order():
    declared = [name for name, value in vars(OutboxSettings).items() if isinstance(value, Setting)]
    assert list(SETTINGS) == declared
    assert len(SETTINGS) == 46
    assert SETTINGS["LEASE_SECONDS"].setting_name == "OUTBOX_LEASE_SECONDS"
    assert all(setting.doc for setting in SETTINGS.values())


# -- the checks ------------------------------------------------------------------------


def test_the_test_settings_pass():
    assert check_settings() == []


def test_every_default_passes():
    defaults = {setting.setting_name: setting.default for setting in SETTINGS.values()}
    assert ids(**defaults) == []
    for name, setting in SETTINGS.items():
        assert setting.problem(setting.default) is None, name


@pytest.mark.parametrize(
    "overrides",
    [
        {"OUTBOX_LEASE_SECONDS": 60},  # an int where a float is expected
        {"OUTBOX_MAX_PAYLOAD_BYTES": 0},  # 0: no limit
        {"OUTBOX_GRACEFUL_TIMEOUT_SECONDS": 0},  # stop at once
        {"OUTBOX_PROMPT_DRAIN": ""},  # off, like None (an unset environment variable)
        {"OUTBOX_PROMPT_DRAIN": "tests.test_settings.hook"},
        {"OUTBOX_CELERY_QUEUE": "outbox"},
        {"OUTBOX_BACKOFF_BASE_SECONDS": 5, "OUTBOX_BACKOFF_MAX_SECONDS": 5},
        {"OUTBOX_TASK_SECONDS": 899.5},
    ],
)
def test_good_values_pass(overrides):
    assert ids(**overrides) == []


def test_unknown_name_is_E010_with_the_closest_name():
    with override_settings(OUTBOX_BACH_SHARDS=5):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E010"]
    assert "OUTBOX_BACH_SHARDS" in errors[0].msg
    assert "Did you mean OUTBOX_BATCH_SHARDS?" in errors[0].hint


def test_unknown_name_hint_points_at_the_settings_reference():
    # It said "the README lists every OUTBOX_* setting", which the README does not.
    with override_settings(OUTBOX_FLUSHH=False):
        (error,) = check_settings()
    assert error.hint.startswith("Did you mean OUTBOX_FLUSH? ")
    assert "settings reference (docs/reference/settings.md)" in error.hint
    assert "README" not in error.hint
    assert (Path(__file__).parent.parent / "docs" / "reference" / "settings.md").is_file()


def test_unknown_name_without_a_close_one_is_E010_without_a_guess():
    with override_settings(OUTBOX_XYZZY=1):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E010"]
    assert "Did you mean" not in errors[0].hint


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", "60"),
        ("LEASE_SECONDS", None),
        ("BATCH_SHARDS", True),  # bool is an int subclass, but no count
        ("BATCH_SHARDS", 2.5),
        ("BACKOFF_BASE_SECONDS", False),
        ("FAST_PATH", 1),
        ("FLUSH_STRICT", "yes"),
        ("PROMPT_DRAIN", 42),
        ("TASKS_BACKEND", None),
        ("CELERY_QUEUE", ["outbox"]),
    ],
)
def test_wrong_type_is_E011(name, value):
    with override_settings(**{f"OUTBOX_{name}": value}):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E011"]
    assert errors[0].msg.startswith(f"OUTBOX_{name} is {value!r}")
    assert f"Set OUTBOX_{name} to {SETTINGS[name].expected}" in errors[0].hint


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BATCH_SHARDS", 0),
        ("BATCH_ROWS", -1),
        ("LEASE_SECONDS", 0),
        ("LEASE_SECONDS", -1.0),
        ("LEASE_SECONDS", math.nan),
        ("LEASE_SECONDS", math.inf),
        ("RECEIVER_DEADLINE_SECONDS", 0.0),
        ("BACKOFF_BASE_SECONDS", 0),
        ("LOOP_INTERVAL_SECONDS", 0),
        ("GRACEFUL_TIMEOUT_SECONDS", -0.5),
        ("MAX_PAYLOAD_BYTES", -1),
        ("MAX_HEADERS_BYTES", -1),
        ("TASK_SHARDS", 0),
        ("TASK_SECONDS", 0),
        ("CELERY_MAX_TASKS", 0),
        ("CELERY_SCHEDULE_SECONDS", 0),
        ("CELERY_TIME_LIMIT_SECONDS", -900),
        ("CELERY_QUEUE", ""),
        ("CELERY_DRAIN_TASK", ""),
        ("TASKS_QUEUE_NAME", ""),
    ],
)
def test_out_of_range_is_E012(name, value):
    with override_settings(**{f"OUTBOX_{name}": value}):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E012"]
    assert errors[0].msg.startswith(f"OUTBOX_{name} is ")
    assert f"Set OUTBOX_{name} to" in errors[0].hint


@django6_only
def test_unknown_tasks_backend_is_E013():
    tasks = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with override_settings(TASKS=tasks, OUTBOX_TASKS_BACKEND="nope"):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E013"]
    assert "OUTBOX_TASKS_BACKEND='nope'" in errors[0].msg
    assert "['default']" in errors[0].hint


@pytest.mark.skipif(django.VERSION >= (6,), reason="before Django 6 there is no TASKS")
def test_tasks_backend_is_not_checked_before_django_6():
    assert ids(OUTBOX_TASKS_BACKEND="nope", OUTBOX_TASKS_QUEUE_NAME="other") == []


@django6_only
@pytest.mark.parametrize(
    ("queues", "queue", "expected"),
    [
        (None, "default", []),  # Django's default QUEUES: ["default"]
        (None, "other", ["outbox.E014"]),
        (["outbox"], "default", ["outbox.E014"]),
        (["outbox"], "outbox", []),
        ([], "anything", []),  # an empty QUEUES allows every queue
    ],
)
def test_unknown_tasks_queue_is_E014(queues, queue, expected):
    backend = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}
    if queues is not None:
        backend["QUEUES"] = queues
    tasks = {"default": backend}
    assert ids(TASKS=tasks, OUTBOX_TASKS_QUEUE_NAME=queue) == expected


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("tests.no_such_module.hook", "cannot be imported: No module named"),
        ("tests.test_settings.no_such_hook", "cannot be imported"),
        ("no_dots", "cannot be imported"),
        ("tests.test_settings.NOT_CALLABLE", "is int, not a callable"),
    ],
)
def test_prompt_drain_that_is_no_importable_callable_is_E015(path, problem):
    with override_settings(OUTBOX_PROMPT_DRAIN=path):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E015"]
    assert errors[0].msg.startswith(f"OUTBOX_PROMPT_DRAIN={path!r} {problem}")


def test_backoff_cap_below_base_is_E016():
    overrides = {"OUTBOX_BACKOFF_BASE_SECONDS": 10.0, "OUTBOX_BACKOFF_MAX_SECONDS": 5}
    with override_settings(**overrides):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E016"]
    assert "OUTBOX_BACKOFF_MAX_SECONDS=5.0" in errors[0].msg
    assert "OUTBOX_BACKOFF_BASE_SECONDS" in errors[0].hint


@pytest.mark.parametrize("budget", [900.0, 1800])
def test_celery_time_limit_within_the_task_budget_is_E017(budget):
    with override_settings(OUTBOX_TASK_SECONDS=budget):
        errors = check_settings()
    assert [error.id for error in errors] == ["outbox.E017"]
    assert "OUTBOX_CELERY_TIME_LIMIT_SECONDS=900.0" in errors[0].msg


def test_rules_across_settings_skip_values_that_failed_their_own_check():
    # A string cap is reported once, as E011, not again by the back-off rule.
    assert ids(OUTBOX_BACKOFF_MAX_SECONDS="1") == ["outbox.E011"]


def test_every_problem_is_reported_at_once():
    overrides = {
        "OUTBOX_BACH_SHARDS": 1,
        "OUTBOX_LEASE_SECONDS": "60",
        "OUTBOX_BATCH_ROWS": 0,
        "OUTBOX_PROMPT_DRAIN": "tests.no_such_module.hook",
        "OUTBOX_BACKOFF_MAX_SECONDS": 1.0,
        "OUTBOX_TASK_SECONDS": 1000,
    }
    assert sorted(ids(**overrides)) == [
        "outbox.E010",
        "outbox.E011",
        "outbox.E012",
        "outbox.E015",
        "outbox.E016",
        "outbox.E017",
    ]


def test_the_settings_checks_are_registered():
    with override_settings(OUTBOX_BATCH_SHARDS=0):
        errors = run_checks()
    assert [error.id for error in errors if error.id.startswith("outbox.")] == ["outbox.E012"]
