"""System checks of what the project declares and plugs in: receivers for every category
(outbox.W001/E001), the metrics adapter (E018), the inbox's retention against the retry
delays (E019), the categories' retry policies (E021) and the backends (E022).

A category without a receiver is a warning (outbox.W001) by default, so a project under
construction, or a quick start, can still `migrate`; its messages are kept and retried,
never dropped. `manage.py check --deploy` makes it an error (outbox.E001) instead, and
`manage.py check --fail-level WARNING` fails on the warning, for CI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import ERROR, WARNING, CheckMessage, Error, Tags, register

from outbox.backends.select import import_backend
from outbox.categories import OutboxCategory, registry
from outbox.conf import SETTINGS, outbox_settings
from outbox.exceptions import MetricsUnavailable, OutboxConfigurationError
from outbox.inbox import inbox_receivers
from outbox.metrics.base import metrics_class
from outbox.models import outbox_models
from outbox.retry import declared_policy, policy_for

# The W001 warnings of the latest check run, with their categories. A check is not told
# whether it runs under --deploy; Django runs the deployment checks after the others in
# the same run, so the deploy check turns these into E001 errors in place, and each
# category is reported once.
_warned: list[tuple[CheckMessage, OutboxCategory]] = []


def _unreceived() -> list[OutboxCategory]:
    """Declared categories that no process signal has a receiver for."""
    signals = {model.process_signal for model in outbox_models()}
    return [
        category
        for category in registry.categories.values()
        if not any(signal.has_listeners(category) for signal in signals)
    ]


def _message(category: OutboxCategory) -> str:
    cls = type(category)
    return f"Outbox category {cls.__name__}.{category.name} ({cls.__module__}) has no receiver."


def _hint(category: OutboxCategory) -> str:
    return (
        f"Connect one where Django imports it at start-up (an AppConfig.ready()): "
        f"@receiver(process_region_outbox, sender={type(category).__name__}.{category.name}) "
        f"or process_control_outbox. Messages without a receiver are kept, never deleted, "
        f"and retried with back-off."
    )


def _warning(category: OutboxCategory) -> CheckMessage:
    hint = _hint(category) + " This is an error (outbox.E001) under check --deploy."
    return CheckMessage(WARNING, _message(category), hint, id="outbox.W001")


@register(Tags.signals)
def check_receivers(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.W001: every declared category needs a receiver, or its messages pile up."""
    _warned[:] = [(_warning(category), category) for category in _unreceived()]
    return [message for message, _ in _warned]


@register(Tags.signals, deploy=True)
def check_receivers_deployed(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E001 (check --deploy): a deployed category without a receiver is an error.

    Adds no message of its own: it turns the W001 warnings of the same run into E001."""
    for message, category in _warned:
        message.level, message.id, message.hint = ERROR, "outbox.E001", _hint(category)
    _warned.clear()
    return []


@register()
def check_metrics(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E018: the metrics adapter cannot be loaded, so the app runs without it."""
    setting = SETTINGS["METRICS"]
    if setting.problem(setting.configured()):
        return []  # outbox.E011 or E012 reports it
    try:
        metrics_class()
    except MetricsUnavailable as error:
        problem = f"{error.problem} The app runs without metrics."
        return [Error(problem, hint=error.hint, id="outbox.E018")]
    return []


@register()
def check_backends(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E022: a backend of OUTBOX_BACKENDS that does not load would stop every
    drain and flush on first use."""
    setting = SETTINGS["BACKENDS"]
    if setting.problem(setting.configured()):
        return []  # outbox.E011 or E012 reports it
    errors: list[CheckMessage] = []
    for path in outbox_settings.BACKENDS:
        try:
            import_backend(path)
        except OutboxConfigurationError as error:
            hint = "Name a subclass of outbox.backends.OutboxBackend by its dotted path."
            errors.append(Error(f"OUTBOX_BACKENDS: {error}.", hint=hint, id="outbox.E022"))
    return errors


@register()
def check_inbox_retention(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E019: inbox records would be pruned while their message may still be
    redelivered: after a dead worker's lease expires, and through every back-off of
    its retries (one back-off where retries never end)."""
    if not inbox_receivers or any(
        SETTINGS[name].problem(SETTINGS[name].configured())
        for name in ("INBOX_RETENTION_SECONDS", "LEASE_SECONDS", "BACKOFF_MAX_SECONDS")
    ):
        return []
    # Each category's limit as the drain applies it; 0 (retry for ever) counts as one
    # back-off, since a failed call rolls its inbox record back with it.
    try:
        limits = [policy_for(value).max_attempts(value) for value in registry.categories]
    except OutboxConfigurationError:
        return []  # outbox.E020 or E021 reports the policy that does not load
    attempts = max([limit for limit in limits or [outbox_settings.MAX_ATTEMPTS] if limit] or [1])
    window = outbox_settings.LEASE_SECONDS + outbox_settings.BACKOFF_MAX_SECONDS * attempts
    retention = outbox_settings.INBOX_RETENTION_SECONDS
    if retention >= window:
        return []
    return [
        Error(
            f"OUTBOX_INBOX_RETENTION_SECONDS={retention:g} is shorter than a message can "
            f"be redelivered ({window:g}s: OUTBOX_LEASE_SECONDS plus "
            f"OUTBOX_BACKOFF_MAX_SECONDS times {attempts} attempt(s)), so an inbox "
            "receiver could apply a message twice.",
            hint=f"Set OUTBOX_INBOX_RETENTION_SECONDS to at least {window:g}.",
            id="outbox.E019",
        )
    ]


@register()
def check_category_policies(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """outbox.E021: a category's `retry_policy()` returns no RetryPolicy, so every
    failure of that category would raise in the drain instead of being retried."""
    hint = "Return a RetryPolicy subclass or instance, or None to follow OUTBOX_RETRY_POLICY."
    problems: list[CheckMessage] = []
    for category in registry.categories.values():
        try:
            declared_policy(category)
        except OutboxConfigurationError as error:
            problems.append(Error(str(error), hint=hint, id="outbox.E021"))
    return problems
