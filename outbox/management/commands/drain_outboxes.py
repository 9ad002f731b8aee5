"""`manage.py drain_outboxes`: drain what is due once, or keep draining with --loop.

Exit status (`outbox.management.exit_codes`): 0 when done, when stopped as asked and
whenever a loop ends; 3 when a one-shot drain left a failed delivery for a retry (one
that asked for it with RetryLater is not a failure here); 4 when the drain stopped with
a receiver still running, past the graceful timeout or at a second signal (its shard's
lease expires); 5 when more receiver calls than OUTBOX_MAX_STUCK_RECEIVERS ran past
OUTBOX_RECEIVER_TIMEOUT_SECONDS and are still running (restart the process).
SIGTERM/SIGINT stop it gracefully, a second one at once
(`outbox.engine.worker.DrainWorker`). It refuses to run inside an open transaction.
`--liveness-file` keeps a file fresh for a liveness probe (`outbox.health.liveness`).
`--metrics-port` serves Prometheus' /metrics from the process while it runs
(`MetricsServer`). With --loop the process records itself as a live drain every
OUTBOX_DRAIN_BEACON_SECONDS (`outbox.health.beacon`) and deletes its record on exit.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections, router
from django.db.models import Count, Min
from django.utils import timezone

from outbox.conf import outbox_settings
from outbox.engine import DrainOutcome, DrainStats, DrainWorker, StopRequest
from outbox.engine.slots import stuck_receivers
from outbox.exceptions import DrainInTransaction, MetricsUnavailable, StuckReceivers
from outbox.health.beacon import drained_databases, start_drain_beacon, stop_drain_beacon
from outbox.health.liveness import LivenessFile
from outbox.health.thresholds import backlog_figures, describe_backlog
from outbox.inbox import inbox_databases, inbox_receivers, prune_inbox
from outbox.management import exit_codes
from outbox.management.arguments import (
    database_alias,
    outbox_table,
    scope_value,
    seconds,
    shard_identifiers,
    whole_number,
)
from outbox.metrics import installed, record_backlog
from outbox.metrics.base import metrics_class
from outbox.models import ShardLease, outbox_models
from outbox.models.drains import LOOP

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

logger = logging.getLogger("outbox.engine")
metrics_logger = logging.getLogger("outbox.metrics")

# The longest a round runs with --liveness-file and --progress-every 0.
LIVENESS_SLICE_SECONDS = 5.0

# The backlog's figures in a heartbeat's record, each as a field `backlog_<name>`
# (None when the database could not be read).
BACKLOG_FIGURES = ("rows", "due_rows", "shards", "lag_seconds", "dead_letters")

# Where --metrics-port listens unless --metrics-address says otherwise: this host only,
# so that nothing is exposed by default. A scrape from elsewhere (a Kubernetes pod's
# port, another host) needs 0.0.0.0 or the address it scrapes.
METRICS_ADDRESS = "127.0.0.1"


class Command(BaseCommand):
    help = "Deliver due outbox messages to their receivers."

    # The last heartbeat's (seconds since start, rows retired, failures): the next one
    # reports the difference, what happened in its interval.
    _last_beat: tuple[float, int, int] = (0.0, 0, 0)

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
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            metavar="N",
            help="Deliver up to N claimed shards at once, 1 or more (default: "
            "OUTBOX_CONCURRENCY); 1 runs one receiver call at a time.",
        )
        parser.add_argument(
            "--max-seconds",
            type=float,
            default=None,
            metavar="SECONDS",
            help="Stop after this long (above 0).",
        )
        parser.add_argument(
            "--liveness-file",
            default=None,
            metavar="PATH",
            help="Touch this file after every drain round and remove it on exit, for a "
            "liveness probe that checks its age.",
        )
        parser.add_argument(
            "--progress-every",
            type=float,
            default=5.0,
            metavar="SECONDS",
            help="Seconds between progress lines (0 turns them off).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            metavar="PORT",
            help="Serve Prometheus' /metrics on this port (1 to 65535) while the command "
            'runs; needs OUTBOX_METRICS = "prometheus". With PROMETHEUS_MULTIPROC_DIR set, '
            "the metrics of every process writing to that directory.",
        )
        parser.add_argument(
            "--metrics-address",
            default=None,
            metavar="ADDRESS",
            help=f"The address --metrics-port listens on (default: {METRICS_ADDRESS}, "
            "this host only); 0.0.0.0 for every interface, as a scrape from another host "
            "or a Kubernetes pod's port needs.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _check_numbers(options)
        self.verbosity = options["verbosity"]
        self.using = database_alias(options["database"])
        self.models = [outbox_table(label) for label in options["table"]]
        self.scopes = [scope_value(name) for name in options["scope"]] or None
        with ExitStack() as running:  # what it started, stopped in reverse when it ends
            if options["metrics_port"] is not None:
                server = self._serve_metrics(options["metrics_port"], options["metrics_address"])
                running.callback(server.close)
            path = options["liveness_file"]
            liveness = LivenessFile(path) if path else None
            if liveness is not None:
                try:  # a missing directory, no permission: say so at start
                    liveness.path.touch()
                except OSError as exc:
                    raise CommandError(f"Cannot write the liveness file {path!r}: {exc}") from exc
                running.callback(liveness.remove)
            if options["loop"]:  # listed as a live drain (OUTBOX_DRAIN_BEACON_SECONDS)
                start_drain_beacon(LOOP, drained_databases(self.models, self.using))
                running.callback(stop_drain_beacon)
            worker = self._worker(options, liveness)
            try:
                with worker.handling_signals():
                    outcome = worker.run()
            except DrainInTransaction as exc:
                raise CommandError(str(exc)) from exc
            except StuckReceivers as exc:
                raise CommandError(str(exc), returncode=exit_codes.STUCK) from exc
        self._finish(outcome, loop=options["loop"])

    def _serve_metrics(self, port: int, address: str | None) -> MetricsServer:
        server = MetricsServer(port, address or METRICS_ADDRESS)
        metrics_logger.info(
            "outbox drain serving Prometheus metrics at %s%s",
            server.url,
            f" (every process of {server.multiprocess_dir})" if server.multiprocess_dir else "",
            extra={
                "event": "outbox.metrics_port",
                "address": server.address,
                "port": server.port,
                "multiprocess_dir": server.multiprocess_dir,
            },
        )
        if self.verbosity >= 1:
            self.stdout.write(f"drain_outboxes: serving Prometheus metrics at {server.url}")
        return server

    def _worker(self, options: dict[str, Any], liveness: LivenessFile | None) -> DrainWorker:
        progress_every = options["progress_every"]
        # A liveness file is touched between rounds: keep rounds short even where no
        # progress line is wanted, or a long backlog would read as a stuck drain.
        slices = progress_every or (LIVENESS_SLICE_SECONDS if liveness else 0.0)
        return DrainWorker(
            self.models,
            using=self.using,
            scopes=self.scopes,
            identifiers=options["shard"] or None,
            loop=options["loop"],
            max_seconds=options["max_seconds"],
            progress_every=slices,
            on_progress=self._progress if progress_every else None,
            on_stop=self._stopping,
            heartbeat_every=outbox_settings.HEARTBEAT_SECONDS if options["loop"] else 0.0,
            on_heartbeat=self._heartbeat,
            on_round=liveness.touch if liveness else None,
            concurrency=options["concurrency"],
        )

    def _finish(self, outcome: DrainOutcome, *, loop: bool) -> None:
        if outcome.abandoned:
            raise CommandError(_abandoned(outcome.stop), returncode=exit_codes.ABANDONED)
        total = outcome.stats
        logger.info(
            "outbox drain finished: %s", total.summary(), extra={"event": "outbox.drain_done"}
        )
        if self.verbosity >= 1:
            self.stdout.write(f"drain_outboxes: {total.summary()}")
            if not loop and (waiting := self._backing_off()):
                self.stdout.write(f"drain_outboxes: {waiting}")
        # A loop retries its failures itself, and a stop asked for is a normal end.
        kept = total.failures - total.retried_later
        if kept and not loop and outcome.stop is None:
            raise CommandError(
                f"{kept} delivery failure(s) on shards "
                f"{', '.join(total.failed_shards[:20])}; rows kept for retry.",
                returncode=exit_codes.FAILED,
            )

    def _backing_off(self) -> str:
        """After a one-shot run: the shards waiting out a back-off after a failure, which
        this run could not deliver, and when the first is due ("" when none)."""
        shards, first = 0, None
        for model in self.models or outbox_models():
            using = self.using or router.db_for_write(model)
            leases = ShardLease.objects.using(using).of(model).backing_off()
            found = leases.aggregate(shards=Count("pk"), first=Min("expires_at"))
            shards += found["shards"]
            if found["first"] is not None and (first is None or found["first"] < first):
                first = found["first"]
        if not shards or first is None:
            return ""
        due = max((first - timezone.now()).total_seconds(), 0.0)
        return (
            f"{shards} shard(s) back off after a failure, their rows kept; the first retry "
            f"is due in {due:.0f}s (outbox_status lists them)."
        )

    def _heartbeat(self, total: DrainStats, elapsed: float) -> None:
        """`--loop`, every OUTBOX_HEARTBEAT_SECONDS, busy or idle: one INFO line with what
        happened since the last heartbeat (rows retired, their rate, failures), the
        totals since the start, the backlog and the lag (echoed to stdout at -v 2). Its
        numbers are fields of the record too. A stall shows as a rate of zero, in the
        line and in `rows_per_second`, not as the average since the start."""
        since, rows_before, failures_before = self._last_beat
        self._last_beat = (elapsed, total.rows_retired, total.failures)
        interval = max(elapsed - since, 0.0)
        rows = total.rows_retired - rows_before
        fields: dict[str, Any] = {
            "interval_seconds": round(interval, 3),
            "rows_retired": rows,
            "rows_per_second": _per_second(rows, interval),
            "failures": total.failures - failures_before,
            "total_seconds": round(elapsed, 3),
            "total_rows_retired": total.rows_retired,
            "total_rows_per_second": _per_second(total.rows_retired, elapsed),
            "total_failures": total.failures,
        }
        try:
            record_backlog(self.using)  # the backlog gauges; nothing without OUTBOX_METRICS
            figures = backlog_figures(self.using)
            shown = describe_backlog(figures)
            if inbox_receivers:  # old records, a second's worth of slices at most
                for using in [self.using] if self.using else inbox_databases():
                    prune_inbox(using, seconds=1.0)
        except DatabaseError:  # the drain thread reconnects by itself; this thread too:
            # a connection found broken is closed, so the next heartbeat opens a new one.
            logger.warning("outbox heartbeat could not read the backlog", exc_info=True)
            close_old_connections()
            figures = dict.fromkeys(BACKLOG_FIGURES)
            shown = "unknown (database unreachable)"
        fields.update({f"backlog_{name}": figures[name] for name in BACKLOG_FIGURES})
        fields["stuck_receivers"] = stuck = stuck_receivers()
        line = (
            f"outbox drain alive: {rows} rows retired in the last {_seconds(interval)} "
            f"({_rate(fields['rows_per_second'])} rows/s), {fields['failures']} failures; "
            f"since start {total.rows_retired} rows retired in {_seconds(elapsed)} "
            f"({_rate(fields['total_rows_per_second'])} rows/s), {total.failures} failures; "
            f"backlog {shown}"
        )
        if stuck:  # see OUTBOX_RECEIVER_TIMEOUT_SECONDS
            line += f"; {stuck} receiver thread(s) stuck in calls given up at the timeout"
        logger.info(line, extra={"event": "outbox.heartbeat", **fields})
        if self.verbosity >= 2:
            self.stdout.write(line)

    def _progress(self, total: DrainStats, elapsed: float) -> None:
        if self.verbosity < 1:
            return
        rate = total.rows_retired / elapsed if elapsed else 0.0
        self.stdout.write(
            f"... {total.rows_retired} rows retired, {total.receiver_calls} receiver calls, "
            f"{total.failures} failures after {elapsed:.0f}s ({rate:.0f} rows/s)"
        )

    def _stopping(self, request: StopRequest) -> None:
        cause = f"signal {request.signum}" if request.signum else "stop requested"
        if request.forced:
            self.stderr.write(
                f"drain_outboxes: {cause} again after {request.elapsed:.1f}s, stopping now"
            )
        else:
            self.stderr.write(f"drain_outboxes: {cause}, stopping after the current receiver")


class MetricsServer:
    """Prometheus' /metrics on `address`:`port`, served by `prometheus_client`'s own
    `start_http_server` on a daemon thread until `close()`, which frees the port.

    It serves the registry the installed Prometheus adapter records into (the default
    `REGISTRY`) or, with PROMETHEUS_MULTIPROC_DIR set, a registry of its own holding a
    `MultiProcessCollector`: the values of every process writing to that directory (the
    drains, web and task workers of one host), this one's included.

    Refused with a CommandError: OUTBOX_METRICS not a Prometheus adapter, a
    PROMETHEUS_MULTIPROC_DIR that is no directory, an address it cannot listen on (a
    port in use, an address not of this host)."""

    def __init__(self, port: int, address: str = METRICS_ADDRESS) -> None:
        self.port = port
        self.address = address
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        registry = _prometheus_registry(self.multiprocess_dir)
        from prometheus_client import start_http_server

        try:
            served: tuple[WSGIServer, threading.Thread] = start_http_server(
                port, addr=address, registry=registry
            )
        except OSError as exc:  # socket.gaierror too: an unknown host name
            raise CommandError(_unservable(port, address, exc)) from exc
        self.server, self.thread = served

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()  # serve_forever returns (within half a second)
        self.server.server_close()  # the listening socket: the port is free at once
        self.thread.join()


def _prometheus_registry(multiprocess_dir: str | None) -> CollectorRegistry:
    """The registry --metrics-port serves; a CommandError saying what to set when
    OUTBOX_METRICS is not a Prometheus adapter."""
    try:
        adapter = metrics_class()
    except MetricsUnavailable as exc:
        raise CommandError(f"--metrics-port cannot serve metrics: {exc}") from exc
    try:
        from outbox.metrics.prometheus import PrometheusMetrics
    except ImportError:  # prometheus_client is not installed: no Prometheus adapter
        adapter = None
    if adapter is None or not issubclass(adapter, PrometheusMetrics):
        raise CommandError(
            "--metrics-port serves Prometheus metrics: set OUTBOX_METRICS = "
            f'"prometheus" (it is {outbox_settings.METRICS!r}) and install '
            "prometheus_client (pip install 'django-outboxes[prometheus]')."
        )
    from prometheus_client import REGISTRY

    from outbox.metrics.prometheus import multiprocess_registry

    if multiprocess_dir is None:
        metrics = installed()
        return metrics.registry if isinstance(metrics, PrometheusMetrics) else REGISTRY
    try:
        return multiprocess_registry(multiprocess_dir)
    except ValueError as exc:
        raise CommandError(
            f"--metrics-port: PROMETHEUS_MULTIPROC_DIR={multiprocess_dir!r} is not a "
            "directory; create it (empty) before the processes start, or unset it."
        ) from exc


def _unservable(port: int, address: str, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--metrics-port {port}: {address}:{port} is in use by another process; "
            "choose a free port (or --metrics-address)."
        )
    return (
        f"--metrics-port {port}: cannot listen on {address}:{port} "
        f"({exc.strerror or exc}); --metrics-address takes an address of this host."
    )


def _per_second(count: int, seconds: float) -> float:
    return round(count / seconds, 3) if seconds > 0 else 0.0


def _rate(per_second: float) -> str:
    """A rate as the line shows it: 0 when nothing moved, a tenth below 10."""
    if not per_second:
        return "0"
    return f"{per_second:.1f}" if per_second < 10 else f"{per_second:.0f}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def _check_numbers(options: dict[str, Any]) -> None:
    """Refuse a number out of range before anything runs: `--max-seconds -1` would end
    the drain before its first claim and exit 0, rows still due."""
    whole_number("--concurrency", options["concurrency"], 1)
    seconds("--max-seconds", options["max_seconds"])
    seconds("--progress-every", options["progress_every"], zero="no progress lines")
    shard_identifiers("--shard", options["shard"])
    whole_number("--metrics-port", options["metrics_port"], 1, 65535)
    if options["metrics_address"] is not None and options["metrics_port"] is None:
        raise CommandError("--metrics-address needs --metrics-port (the port to listen on).")


def _abandoned(stop: StopRequest | None) -> str:
    if stop is not None and stop.forced:
        why = f"at a second stop request {stop.elapsed:.1f}s after the first"
    else:
        why = f"past the graceful timeout ({outbox_settings.GRACEFUL_TIMEOUT_SECONDS}s)"
    return f"stopped {why} with a receiver still running; its shard's lease will expire"
