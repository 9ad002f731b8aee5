"""`manage.py demo`: realistic outbox traffic from a clean state, drained and checked.

Migrates and wipes both databases, writes organizations, projects, audit events and
users through every producer write path, rolls some work back, drains with a billing
outage on the way, and checks that every receiver saw exactly what committed. Exits
non-zero (CommandError) when the check fails.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.billing import billing_api
from accounts.demo import rabbitmq, reset, traffic, verify
from accounts.demo.drain import DrainReport, drain_until_empty
from accounts.demo.traffic import Tally
from accounts.demo.updates import UpdateMix
from accounts.models import AuditLogEntry, Organization, Project, UserAccount


class Command(BaseCommand):
    help = "Generate outbox traffic from a clean state, drain it, and check every delivery."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--orgs", type=int, default=200, help="Organizations (3 projects and 1 user each)."
        )
        parser.add_argument(
            "--updates", type=int, default=3000, help="Object changes after creation."
        )
        parser.add_argument("--seed", type=int, default=42, help="Seed of the random traffic.")
        parser.add_argument(
            "--billing-outage",
            type=int,
            default=None,
            metavar="CALLS",
            help="Billing calls refused once the drain starts, each retried with back-off "
            "(default: one per 5 organizations).",
        )
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="Give up draining after this long."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["orgs"] < 2 or options["updates"] < 0:
            raise CommandError("--orgs must be at least 2 and --updates at least 0.")
        if options["verbosity"] < 2:
            # Each refused billing call logs a warning; the summary counts them instead.
            logging.getLogger("outbox").setLevel(logging.ERROR)
        started = time.monotonic()
        reset.migrate_databases()
        reset.wipe_demo_tables()
        publishing = rabbitmq.start()
        tally = self._write_traffic(options)
        traffic_seconds = time.monotonic() - started
        outage = options["billing_outage"]
        billing_api.start_outage(max(1, options["orgs"] // 5) if outage is None else outage)
        drained = drain_until_empty(options["timeout"])
        problems = verify.verify(tally, drained)
        published, broker_problems = rabbitmq.finish(publishing)
        problems += broker_problems
        self._summary(tally, drained, traffic_seconds, time.monotonic() - started, options)
        self.stdout.write(published)
        if problems:
            raise CommandError("check failed:\n  " + "\n  ".join(problems))
        self.stdout.write(self.style.SUCCESS(f"check passed: {self._checked()}"))

    def _write_traffic(self, options: dict[str, Any]) -> Tally:
        rng = random.Random(options["seed"])
        tally = Tally()
        traffic.create_population(options["orgs"], rng, tally)
        UpdateMix(rng, tally).run(options["updates"])
        traffic.delete_some(rng, tally)
        traffic.roll_back_requests(rng, tally)
        return tally

    def _summary(
        self,
        tally: Tally,
        drained: DrainReport,
        traffic_seconds: float,
        elapsed: float,
        options: dict[str, Any],
    ) -> None:
        stats = drained.stats
        orgs, updates, seed = options["orgs"], options["updates"], options["seed"]
        drained_rows = tally.written - tally.flushed
        lines = [
            f"traffic    {orgs} organizations, {updates} updates, seed {seed}",
            f"written    {tally.written} outbox rows: {tally.flushed} flushed after commit by "
            f"{tally.sync_requests} requests, {drained_rows} left to the drain",
            f"coalesced  {stats.coalesced} rows retired by a newer row of their group",
            f"delivered  {stats.receiver_calls} receiver calls, {stats.shards} shard claims, "
            f"{drained.rounds} drain round(s)",
            f"retried    {stats.failures} failed calls (billing refused {billing_api.refused}), "
            "rescheduled with back-off",
            f"elapsed    {elapsed:.2f}s (setup and traffic {traffic_seconds:.2f}s, "
            f"drain {drained.seconds:.2f}s)",
        ]
        self.stdout.write("\n".join(lines))

    @staticmethod
    def _checked() -> str:
        return (
            f"mirrors match {Organization.objects.count()} organizations, "
            f"{Project.objects.count()} projects and {UserAccount.objects.count()} users; "
            f"{AuditLogEntry.objects.count()} audit events delivered exactly once; "
            "rolled-back writes never arrived; outboxes empty"
        )
