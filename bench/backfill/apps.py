"""The backfill bench's Django app: a model with existing rows and a counting receiver."""

from __future__ import annotations

from django.apps import AppConfig


class BackfillBenchConfig(AppConfig):
    name = "bench.backfill"
    label = "bench_backfill"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from bench.backfill import models

        models.connect_receiver()
