"""Command-line values shared by the outbox's management commands, checked the same way:
a bad one is a CommandError naming it, never a traceback."""

from __future__ import annotations

import getpass
import math
from collections.abc import Callable, Iterable
from typing import Any

from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from outbox.categories import registry
from outbox.exceptions import InvalidOutboxMessage
from outbox.models import OutboxBase
from outbox.models.audit import admin_log_installed
from outbox.models.outbox import BIGINT_MAX, BIGINT_MIN


def database_alias(alias: str | None) -> str | None:
    """`alias` if DATABASES has it (None stays None: each table's own database)."""
    if alias is not None and alias not in settings.DATABASES:
        raise CommandError(
            f"Unknown database {alias!r} (DATABASES has {list(settings.DATABASES)})."
        )
    return alias


def outbox_table(label: str) -> type[OutboxBase]:
    """The outbox model named `label` (`app_label.Model`)."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError) as exc:
        raise CommandError(f"Unknown outbox table {label!r}.") from exc
    if not issubclass(model, OutboxBase):
        raise CommandError(f"{label} is not an outbox table.")
    return model


def whole_number(option: str, value: int | None, least: int, most: int | None = None) -> None:
    """Refuse `value` (given to `option`; None: not given) below `least` or above `most`.
    argparse checks the type only: the range is checked here, so that a value out of
    range is a command error (exit status 1), and call_command's keyword values, which
    argparse never sees, are checked too."""
    if value is None or (least <= value and (most is None or value <= most)):
        return
    allowed = f"from {least} to {most}" if most is not None else f"of {least} or more"
    raise CommandError(f"{option} must be a whole number {allowed}, not {value}.")


def seconds(option: str, value: float | None, *, zero: str | None = None) -> None:
    """Refuse `value` (given to `option`; None: not given) unless it is a finite number of
    seconds above 0, or 0 too where `zero` says what 0 does. argparse's float takes
    "-1", "nan" and "inf"."""
    if value is None or (math.isfinite(value) and (value > 0 or (value == 0 and zero))):
        return
    allowed = f", 0 or more (0: {zero})" if zero else " above 0"
    raise CommandError(f"{option} must be a number of seconds{allowed}, not {value:g}.")


def shard_identifiers(option: str, values: list[int]) -> None:
    """Refuse a shard_identifier its 64-bit column cannot hold (a database would raise
    an overflow error, not say which value)."""
    for value in values:
        whole_number(option, value, BIGINT_MIN, BIGINT_MAX)


def scope_value(name: str) -> int:
    """The value of the scope named `name` (member name or value); an unknown one is a
    command error listing the declared scopes."""
    try:
        return int(registry.scope_by_name(name))
    except InvalidOutboxMessage:
        scopes = _listed(registry.scopes, registry.scope_name)
        raise CommandError(f"Unknown scope {name!r}; the scopes are {scopes}.") from None


def category_value(name: str) -> int:
    """The value of the category named `name` (member name or value); an unknown one is
    a command error listing the categories the scopes list."""
    categories = registry.categories
    by_name = {category.name: value for value, category in categories.items()}
    if name.lstrip("-").isdigit() and int(name) in categories:
        return int(name)
    if name.upper() in by_name:
        return by_name[name.upper()]
    listed = _listed(categories, registry.category_name)
    raise CommandError(f"Unknown category {name!r}; the categories are {listed}.")


def _listed(values: Iterable[int], name: Callable[[int], str]) -> str:
    """`ORGANIZATION (0), USER (1)`: the values, in order, each with its declared name."""
    return ", ".join(f"{name(value)} ({value})" for value in sorted(values)) or "none declared"


def add_audit_arguments(
    parser: CommandParser, actions: str, *, per: str = "", note: str = ""
) -> None:
    """`--user USERNAME` and `--no-audit`, for a command whose `actions` write admin log
    entries (one `per` what, where given; `note`: a last word on the default)."""
    audit = parser.add_mutually_exclusive_group()
    audit.add_argument(
        "--user", metavar="USERNAME",
        help=f"{actions}: the user the admin log names{per}; an unknown one is refused "
        "before anything changes. Default: the user named as your OS login name; where "
        f"none is, the command acts and warns that it wrote no entry{note}.",
    )  # fmt: skip
    audit.add_argument(
        "--no-audit", action="store_true",
        help=f"{actions}: write no admin log entry, and no warning about it.",
    )  # fmt: skip


def audit_user(named: str | None, *, no_audit: bool) -> tuple[Any, str]:
    """The pk of the user an operator command's admin log entries name (None: no entry),
    and the warning to give when none could be found. `named`: `--user`, refused before
    anything changes when no user has it. Without it, the user whose username is the OS
    login name (`getpass.getuser()`), where there is one; where there is none, no entry
    and a warning: the audit never stands between an operator and what they do."""
    if no_audit:
        return None, ""
    if not admin_log_installed():
        if named is not None:
            raise CommandError(
                "--user: django.contrib.admin is not installed, so there is no admin "
                "log to write; leave --user out."
            )
        return None, ""
    if named is not None:
        user = _user_named(named)
        if user is None:
            raise CommandError(f"--user: no user has the username {named!r}; nothing was changed.")
        return user.pk, ""
    login = _login_name()
    user = _user_named(login) if login else None
    if user is not None:
        return user.pk, ""
    whose = f"no user has your login name {login!r}" if login else "you have no login name"
    return None, (
        f"No admin log entry will be written: no --user given, and {whose}. Name the "
        "user to record with --user USERNAME, or say --no-audit."
    )


def _login_name() -> str:
    """The OS login name (`getpass.getuser()`), or "" where the process has none."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for the uid (3.13 raises OSError, before KeyError)
        return ""


def _user_named(username: str) -> Any:
    """The Django user with this username (the user model's USERNAME_FIELD), or None."""
    model = get_user_model()
    return model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()
