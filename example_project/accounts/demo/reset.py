"""Bring both databases to a clean, migrated state before a demo run."""

from __future__ import annotations

from django.apps import apps
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connections

from outbox.models import ControlOutbox, RegionOutbox, ShardLease

DATABASES = ("default", "control")


def migrate_databases() -> None:
    """Apply every migration to both databases (every table exists on both)."""
    for alias in DATABASES:
        call_command("migrate", database=alias, interactive=False, verbosity=0)


def wipe_demo_tables() -> None:
    """Empty the example app's tables and the outbox tables on both databases.

    Ids restart from 1, so a run with the same --seed picks the same objects. Other
    tables (users of the admin, sessions) are left alone.
    """
    models = [
        *apps.get_app_config("accounts").get_models(),
        RegionOutbox,
        ControlOutbox,
        ShardLease,
    ]
    tables = [model._meta.db_table for model in models]
    for alias in DATABASES:
        ops = connections[alias].ops
        ops.execute_sql_flush(ops.sql_flush(no_style(), tables, reset_sequences=True))
