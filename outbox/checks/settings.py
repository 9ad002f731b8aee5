"""System checks of the ``OUTBOX_*`` settings (outbox.E010 ... outbox.E017, outbox.E020).

- E010: an ``OUTBOX_*`` name that is no setting (likely a typo, silently ignored).
- E011: a value of the wrong type; E012: a value out of range (e.g. a count below 1).
- E013: ``OUTBOX_TASKS_BACKEND`` is no alias of ``TASKS`` (Django 6);
  E014: ``OUTBOX_TASKS_QUEUE_NAME`` is no queue of that backend.
- E015: ``OUTBOX_PROMPT_DRAIN`` is no importable callable.
- E016: ``OUTBOX_BACKOFF_MAX_SECONDS`` below ``OUTBOX_BACKOFF_BASE_SECONDS``.
- E017: ``OUTBOX_CELERY_TIME_LIMIT_SECONDS`` not above ``OUTBOX_TASK_SECONDS``.
- E020: ``OUTBOX_RETRY_POLICY`` does not import or is no ``RetryPolicy`` subclass.
- E024: ``OUTBOX_WRITER_HEADERS_ALLOWED`` names a header that is no credential.

E018 (``OUTBOX_METRICS`` names an adapter that cannot be loaded) is with the checks of
what the project plugs in (`outbox.checks.declarations`).

The rules across settings only look at values that passed E011 and E012.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from typing import Any

import django
from django.apps import AppConfig
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, register
from django.utils.module_loading import import_string

from outbox.conf import PREFIX, SETTINGS, outbox_settings
from outbox.exceptions import OutboxConfigurationError
from outbox.headers import CREDENTIALS
from outbox.retry import load_policy

# Django's default queues of a Tasks backend without QUEUES (DEFAULT_TASK_QUEUE_NAME).
_DEFAULT_TASK_QUEUES = ["default"]


@register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Every problem of the ``OUTBOX_*`` settings as they are now."""
    values = _valid_values()
    return [
        *_unknown_names(),
        *_bad_values(),
        *_tasks_backend(values),
        *_prompt_drain(values),
        *_backoff(values),
        *_celery_time_limit(values),
        *_retry_policy(values),
        *_writer_headers_allowed(values),
    ]


def _valid_values() -> dict[str, Any]:
    """The settings whose value has the right type and range, by name."""
    return {
        name: getattr(outbox_settings, name)
        for name, setting in SETTINGS.items()
        if not setting.problem(setting.configured())
    }


def _unknown_names() -> Iterator[Error]:
    """outbox.E010: Django ignores a misspelt setting; so would the app, silently."""
    for name in sorted(dir(django_settings)):
        short = name.removeprefix(PREFIX)
        if not name.startswith(PREFIX) or short in SETTINGS:
            continue
        close = difflib.get_close_matches(short, SETTINGS, n=1)
        guess = f"Did you mean {PREFIX}{close[0]}? " if close else ""
        yield Error(
            f"{name} is not a django-outboxes setting, so it has no effect.",
            hint=f"{guess}Rename or remove it; the settings reference "
            f"(docs/reference/settings.md) lists every {PREFIX}* setting.",
            id="outbox.E010",
        )


def _bad_values() -> Iterator[Error]:
    """outbox.E011 (wrong type) and outbox.E012 (out of range), one per setting."""
    for setting in SETTINGS.values():
        value = setting.configured()
        type_problem = setting.type_problem(value)
        problem = type_problem or setting.value_problem(value)
        if problem:
            yield Error(
                f"{setting.setting_name} {problem}.",
                hint=(
                    f"Set {setting.setting_name} to {setting.expected} (or remove it: the "
                    f"default is {setting.default!r})."
                ),
                id="outbox.E011" if type_problem else "outbox.E012",
            )


def _tasks_backend(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E013 and outbox.E014: enqueueing an outbox task would raise."""
    alias = values.get("TASKS_BACKEND")
    if django.VERSION < (6,) or alias is None:
        return  # Django's Tasks framework (and its TASKS setting) came with Django 6
    backends = getattr(django_settings, "TASKS", {})
    params = backends.get(alias)
    if not isinstance(params, dict):
        yield Error(
            f"OUTBOX_TASKS_BACKEND={alias!r} is not a backend alias in TASKS.",
            hint=f"Set OUTBOX_TASKS_BACKEND to one of {sorted(backends)}, or add {alias!r} "
            "to TASKS.",
            id="outbox.E013",
        )
        return
    queue = values.get("TASKS_QUEUE_NAME")
    queues = set(params.get("QUEUES", _DEFAULT_TASK_QUEUES))
    if queue is not None and queues and queue not in queues:
        yield Error(
            f"OUTBOX_TASKS_QUEUE_NAME={queue!r} is not a queue of the Tasks backend "
            f"{alias!r} (its QUEUES are {sorted(queues)}).",
            hint=f"Set OUTBOX_TASKS_QUEUE_NAME to one of them, or add {queue!r} to "
            f"TASKS[{alias!r}]['QUEUES'].",
            id="outbox.E014",
        )


def _prompt_drain(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E015: the hook is imported after commits, where a failure is only logged."""
    path = values.get("PROMPT_DRAIN")
    if not path:
        return
    hint = (
        "Set OUTBOX_PROMPT_DRAIN to the dotted path of a callable, such as "
        "'outbox.integrations.celery.prompt_drain', or to None to leave the rows to the "
        "periodic drain."
    )
    try:
        hook = import_string(path)
    except Exception as exc:  # whatever importing raises would also fail every commit hook
        problem = f"cannot be imported: {exc}"
    else:
        if callable(hook):
            return
        problem = f"is {type(hook).__name__}, not a callable"
    yield Error(f"OUTBOX_PROMPT_DRAIN={path!r} {problem}", hint=hint, id="outbox.E015")


def _backoff(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E016: a cap below the first delay leaves no back-off at all."""
    base, cap = values.get("BACKOFF_BASE_SECONDS"), values.get("BACKOFF_MAX_SECONDS")
    if base is not None and cap is not None and cap < base:
        yield Error(
            f"OUTBOX_BACKOFF_MAX_SECONDS={cap!r} is below OUTBOX_BACKOFF_BASE_SECONDS="
            f"{base!r}: every retry would wait the cap instead of backing off.",
            hint="Raise OUTBOX_BACKOFF_MAX_SECONDS to at least OUTBOX_BACKOFF_BASE_SECONDS, "
            "or lower the base.",
            id="outbox.E016",
        )


def _celery_time_limit(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E017: Celery would kill every drain task that uses its whole budget."""
    limit, budget = values.get("CELERY_TIME_LIMIT_SECONDS"), values.get("TASK_SECONDS")
    if limit is not None and budget is not None and limit <= budget:
        yield Error(
            f"OUTBOX_CELERY_TIME_LIMIT_SECONDS={limit!r} is not above OUTBOX_TASK_SECONDS="
            f"{budget!r}: Celery would kill a drain task before its budget ends, leaving its "
            "shards leased until their leases expire.",
            hint="Raise OUTBOX_CELERY_TIME_LIMIT_SECONDS well above OUTBOX_TASK_SECONDS (it "
            "also bounds the receiver in flight when the budget ends), or lower the budget.",
            id="outbox.E017",
        )


def _retry_policy(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E020: every failed delivery asks the policy, so one that does not load
    would fail the drain at its first failure instead of retrying it."""
    path = values.get("RETRY_POLICY")
    if path is None:
        return
    try:
        load_policy(path)
    except OutboxConfigurationError as error:
        problem = str(error)
    except Exception as exc:  # importing the module raised something else
        problem = f"OUTBOX_RETRY_POLICY = {path!r} cannot be imported ({exc!r})."
    else:
        return
    yield Error(
        problem,
        hint="Set OUTBOX_RETRY_POLICY to the dotted path of a subclass of "
        "outbox.retry.RetryPolicy, or remove it for the default 'outbox.retry.RetryPolicy'.",
        id="outbox.E020",
    )


def _writer_headers_allowed(values: dict[str, Any]) -> Iterator[Error]:
    """outbox.E024: only credentials can be handed to writers; the other reserved names
    frame a request or steer a Celery worker whatever the project wants."""
    names = values.get("WRITER_HEADERS_ALLOWED") or []
    refused = sorted({name for name in names if name.lower() not in CREDENTIALS})
    if refused:
        yield Error(
            f"OUTBOX_WRITER_HEADERS_ALLOWED lists {refused}, which a writer can never set.",
            hint=f"List only {sorted(CREDENTIALS)}: the other reserved headers frame HTTP "
            "requests or steer Celery workers (see the Security page of the docs).",
            id="outbox.E024",
        )
