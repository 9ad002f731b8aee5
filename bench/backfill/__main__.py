"""The backfill bench: `manage.py outbox_backfill` on a table of existing objects.

    python -m bench.backfill --db postgres --objects 100000 [--beside-drain]

Loads `--objects` customers that have no message yet (one bulk insert, not measured),
then measures:

1. the backfill alone: `outbox_backfill bench_backfill.Customer --category
   CUSTOMER_UPDATE`, objects per second, and checks one message per object;
2. the drain of what it wrote (`drain_outboxes`, one-shot): rows per second, and checks
   that each object reached the receiver exactly once;
3. with `--beside-drain` (PostgreSQL, MariaDB): the backfill again, in a child process
   with `--max-pending`, while `drain_outboxes --loop` runs in another; the child is
   killed with SIGKILL once past half the objects, and the backfill resumed in this
   process with `--after` the last primary key its progress printed. Measured from the
   first backfill's start to the table empty; checked: the drain's receiver calls are the
   objects, plus at most the one batch that may have committed between the progress line
   read and the kill (the batch in hand when the kill came rolled back).

It prints one line per step and exits 1 when a check fails. The figures go in
bench/README.md ("Backfill"), with the load average.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CATEGORY = ("--category", "CUSTOMER_UPDATE")
MODEL = "bench_backfill.Customer"
MANAGE = [sys.executable, "-m", "django"]  # with this process's settings and database


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backfill")
    parser.add_argument("--db", choices=["postgres", "mariadb", "sqlite"], default="postgres")
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--max-pending", type=int, default=20_000)
    parser.add_argument("--beside-drain", action="store_true")
    args = parser.parse_args()
    if args.beside_drain and args.db == "sqlite":
        parser.error("--beside-drain needs PostgreSQL or MariaDB (SQLite has one writer)")
    os.environ["OUTBOX_BENCH_BACKFILL_DB"] = args.db
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.backfill.settings"
    _create_database(args.db)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    _load(args.objects)
    failures = _alone(args)
    if args.beside_drain:
        failures += _beside_drain(args)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failures else 0


def _alone(args: argparse.Namespace) -> int:
    from django.core.management import call_command

    from bench.backfill.models import delivered
    from outbox.models import RegionOutbox

    started = time.perf_counter()
    call_command("outbox_backfill", MODEL, *CATEGORY, "--batch-size", str(args.batch_size),
                 verbosity=0)  # fmt: skip
    seconds = time.perf_counter() - started
    written = RegionOutbox.objects.count()
    print(
        f"{args.db}: backfill of {args.objects:,} objects, batches of {args.batch_size}: "
        f"{seconds:.2f}s, {args.objects / seconds:,.0f} objects/s; {written:,} messages"
    )
    started = time.perf_counter()
    call_command("drain_outboxes", verbosity=0)
    seconds = time.perf_counter() - started
    once = sum(1 for count in delivered.values() if count == 1)
    print(
        f"{args.db}: drain of the backfill: {seconds:.2f}s, {written / seconds:,.0f} rows/s; "
        f"{len(delivered):,} objects delivered, {once:,} exactly once"
    )
    ok = written == args.objects == once == len(delivered)
    if not ok:
        print(f"{args.db}: CHECK FAILED: backfill or drain lost or repeated a message")
    return 0 if ok else 1


def _beside_drain(args: argparse.Namespace) -> int:
    """The backfill killed halfway and resumed, while a drain loop runs beside it."""
    drain = subprocess.Popen(
        [*MANAGE, "drain_outboxes", "--loop", "--progress-every", "0"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        return _killed_and_resumed(args, drain)
    finally:  # never leave the drain loop running, whatever happened
        if drain.poll() is None:
            drain.kill()
            drain.wait()


def _killed_and_resumed(args: argparse.Namespace, drain: subprocess.Popen[str]) -> int:
    from django.core.management import call_command

    from outbox.models import RegionOutbox

    started = time.perf_counter()
    child = subprocess.Popen(
        [*MANAGE, "outbox_backfill", MODEL, *CATEGORY, "--batch-size", str(args.batch_size),
         "--max-pending", str(args.max_pending)],
        cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    last, done = None, 0
    assert child.stderr is not None
    for line in child.stderr:  # a progress line per batch (stderr is not a terminal)
        found = re.search(r": ([\d,]+)/[\d,]+ objects .* last pk (\d+)$", line.strip())
        if found:
            done, last = int(found[1].replace(",", "")), found[2]
        if done >= args.objects // 2:
            child.send_signal(signal.SIGKILL)
            break
    child.wait()
    killed_at = time.perf_counter() - started
    call_command("outbox_backfill", MODEL, *CATEGORY, "--batch-size", str(args.batch_size),
                 "--max-pending", str(args.max_pending), "--after", str(last),
                 verbosity=0)  # fmt: skip
    backfilled = time.perf_counter() - started
    while RegionOutbox.objects.exists():
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    drain.send_signal(signal.SIGTERM)
    output, _ = drain.communicate(timeout=60)
    calls = re.search(r"receiver calls (\d+)", output)
    print(
        f"{args.db}: beside a drain loop, --max-pending {args.max_pending:,}: killed "
        f"(SIGKILL) at {done:,} objects after {killed_at:.2f}s, resumed --after {last}; "
        f"backfill done at {backfilled:.2f}s, all delivered at {seconds:.2f}s "
        f"({args.objects / seconds:,.0f} objects/s end to end); drain receiver calls "
        f"{calls[1] if calls else '?'}"
    )
    # A batch may commit between the progress line read and the SIGKILL: resumed after
    # the line, its objects are written again, and delivered twice if drained meanwhile.
    ok = calls is not None and args.objects <= int(calls[1]) <= args.objects + args.batch_size
    if not ok:
        print(f"{args.db}: CHECK FAILED: drain output: {output.strip()[-500:]}")
    return 0 if ok else 1


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _create_database(vendor: str) -> None:
    """The bench's database, afresh: it is scratch."""
    from bench.backfill import settings

    config = settings.DATABASES["default"]
    if vendor == "sqlite":
        Path(config["NAME"]).unlink(missing_ok=True)
    elif vendor == "postgres":
        from bench.db import create_database

        create_database(config["NAME"])
    else:
        import MySQLdb

        server = MySQLdb.connect(
            host=config["HOST"], port=int(config["PORT"]), user=config["USER"],
            password=config["PASSWORD"],
        )  # fmt: skip
        with server.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{config['NAME']}`")
            cursor.execute(f"CREATE DATABASE `{config['NAME']}` CHARACTER SET utf8mb4")
        server.close()


def _load(objects: int) -> None:
    """The existing customers, without messages (a plain queryset: no producer)."""
    from django.db import models

    from bench.backfill.models import Customer

    plans = ("free", "team", "enterprise")
    models.QuerySet(Customer).bulk_create(
        (Customer(name=f"customer {n}", plan=plans[n % 3]) for n in range(objects)),
        batch_size=5000,
    )


if __name__ == "__main__":
    sys.exit(main())
