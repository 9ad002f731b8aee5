"""`manage.py drain_outboxes`: drain what is due once, or keep draining with --loop.

Exit status: 0 when every claimed shard was delivered; 3 when at least one receiver
failed (its rows are rescheduled with back-off and kept); 4 when a stop signal's
graceful timeout passed with a receiver still running (its shard's lease expires).

SIGTERM/SIGINT stop it gracefully (`outbox.integrations.graceful`); a second one stops
it at once.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import InterfaceError, OperationalError, connections

from outbox.categories import registry
from outbox.conf import outbox_settings
from outbox.engine import DrainStats, drain_outboxes, outbox_models
from outbox.exceptions import InvalidOutboxMessage
from outbox.integrations import graceful
from outbox.models import OutboxBase

logger = logging.getLogger("outbox.engine")

FAILED_EXIT_STATUS = 3
ABANDONED_EXIT_STATUS = 4


class Command(BaseCommand):
    help = "Deliver due outbox messages to their receivers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep draining until stopped.")
        parser.add_argument(
            "--table",
            action="append",
            default=[],
            metavar="APP_LABEL.MODEL",
            help="Only this outbox table (repeatable), e.g. outbox.RegionOutbox.",
        )
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            metavar="SCOPE",
            help="Only this shard scope, by name or value (repeatable).",
        )
        parser.add_argument(
            "--shard",
            action="append",
            default=[],
            type=int,
            metavar="ID",
            help="Only this shard_identifier (repeatable).",
        )
        parser.add_argument("--database", default=None, help="Database alias to drain.")
        parser.add_argument("--max-seconds", type=float, default=None, help="Stop after this long.")
        parser.add_argument(
            "--progress-every",
            type=float,
            default=5.0,
            help="Seconds between progress lines (0 turns them off).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tables = [self._table(label) for label in options["table"]] or outbox_models()
        try:
            scopes = [int(registry.scope_by_name(name)) for name in options["scope"]]
        except InvalidOutboxMessage as exc:
            raise CommandError(str(exc)) from exc
        previous = self._stop_on_signals()
        try:
            outcome = graceful.run_gracefully(
                lambda stop: self._drain(tables, scopes, stop, options), name="outbox-drain"
            )
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if previous:  # this command took the process's signals, and so its stop
                graceful.reset()
        if not outcome.finished or outcome.result is None:
            raise CommandError(
                "stopped with a receiver still running past the graceful timeout; "
                "its shard's lease will expire",
                returncode=ABANDONED_EXIT_STATUS,
            )
        total = outcome.result
        self.stdout.write(f"drain_outboxes: {total.summary()}")
        if total.failures:
            raise CommandError(
                f"{total.failures} delivery failure(s) on shards "
                f"{', '.join(sorted(set(total.failed_shards))[:20])}; rows kept for retry.",
                returncode=FAILED_EXIT_STATUS,
            )

    def _drain(
        self,
        tables: list[type[OutboxBase]],
        scopes: list[int],
        stop: threading.Event,
        options: dict[str, Any],
    ) -> DrainStats:
        started = time.monotonic()
        deadline = started + options["max_seconds"] if options["max_seconds"] else None
        every = options["progress_every"]
        total = DrainStats()
        while True:
            # Drain in slices no longer than the progress interval.
            slice_end = time.monotonic() + every if every else None
            if deadline is not None:
                slice_end = min(slice_end or deadline, deadline)
            try:
                stats = drain_outboxes(
                    tables,
                    using=options["database"],
                    scopes=scopes or None,
                    identifiers=options["shard"] or None,
                    deadline=slice_end,
                    stop=stop,
                )
            except (OperationalError, InterfaceError):
                if not options["loop"]:
                    raise
                self._reconnect_after_error()
                stats = DrainStats()
            total.add(stats)
            now = time.monotonic()
            cut_short = slice_end is not None and now >= slice_end and stats.shards > 0
            if every and cut_short:
                self._progress(total, now - started)
            if stop.is_set() or (deadline is not None and now >= deadline):
                break
            if not cut_short and not options["loop"]:
                break
            if not stats.shards:
                stop.wait(float(outbox_settings.LOOP_INTERVAL_SECONDS))
        total.seconds = time.monotonic() - started
        return total

    def _reconnect_after_error(self) -> None:
        """A lost connection (server restart, connection killed, network) must not end a
        long-running drain: drop this thread's connections, so the next round opens new
        ones. Leases of the interrupted batch expire by themselves."""
        logger.warning(
            "outbox drain lost its database connection; reconnecting",
            exc_info=True,
            extra={"event": "outbox.drain_reconnect"},
        )
        connections.close_all()

    def _table(self, label: str) -> type[OutboxBase]:
        try:
            model = apps.get_model(label)
        except (LookupError, ValueError) as exc:
            raise CommandError(f"Unknown outbox table {label!r}.") from exc
        if not issubclass(model, OutboxBase):
            raise CommandError(f"{label} is not an outbox table.")
        return model

    def _progress(self, total: DrainStats, elapsed: float) -> None:
        rate = total.rows_retired / elapsed if elapsed else 0.0
        self.stdout.write(
            f"... {total.rows_retired} rows retired, {total.receiver_calls} receiver calls, "
            f"{total.failures} failures after {elapsed:.0f}s ({rate:.0f} rows/s)"
        )

    def _stop_on_signals(self) -> dict[int, Any]:
        """SIGTERM/SIGINT: claim nothing new, let the receiver in flight finish within
        OUTBOX_GRACEFUL_TIMEOUT_SECONDS, release the other leases; a second signal stops
        at once. Returns the handlers it replaced, to be put back.
        """
        if threading.current_thread() is not threading.main_thread():
            return {}

        def request_stop(signum: int, frame: Any) -> None:
            again = graceful.shutdown_requested()
            self.stderr.write(
                f"drain_outboxes: signal {signum}, "
                + ("stopping now" if again else "stopping after the current receiver")
            )
            graceful.request_shutdown(force=again)

        return {
            signum: signal.signal(signum, request_stop)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
