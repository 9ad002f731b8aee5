"""`python -m stress [--db postgres|mariadb] [--short] [--no-faults] [--messages N]
[--faults KIND,...] [--fault-every S] [--write-seconds S] [--writers N] [--drainers N]
[--prefill N] [--drain-after S] [--fault-backlog N] [--concurrency N] [--receiver-ms MS]
[--effect-ms MS] [--relay amqp] [--name NAME]`: run, check, report.

Writes stress/results/<name>.json (one object per database, merged with earlier runs)
and <name>.md; <name> is `latest` for a full run, `short` for --short, the fault kinds
(`kill`) when --faults picks some. Exits 1 when anything was lost, reordered,
overlapped, delivered without the lease or duplicated without a fault to explain it,
when the inbox receiver applied a message twice or lost, invented or misnamed an effect,
when a graceful stop missed one of its facts, or when a fault kind was never injected
(see `stress/report.py`). With `--relay amqp` (the relay leg) every message is also
published through an AmqpRelay to a queue of the run's own, read back at the end and
checked there (`stress/consumer.py`); the name gets `-relay-amqp`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    args = _arguments()
    os.environ["STRESS_DB"] = args.db
    os.environ["STRESS_CONCURRENCY"] = str(args.concurrency)
    os.environ["STRESS_RECEIVER_MS"] = str(args.receiver_ms)
    os.environ["STRESS_EFFECT_MS"] = str(args.effect_ms)
    os.environ.setdefault("STRESS_DB_NAME", "outbox_stress")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stress.settings")
    _setup()
    from stress import checker, consumer, db, report, runner
    from stress.broker import Broker

    db.reset()
    plan = _plan(args)
    tmp = Path(tempfile.mkdtemp(prefix=f"stress-{args.db}-"))
    print(
        f"stress {plan.name} on {args.db}: {plan.messages} messages, {plan.shards} shards, "
        f"{plan.writers} writers over {plan.seconds:g} s, {plan.drainers} drainers x "
        f"{args.concurrency} slots (unsettled bound {_unsettled():g} s), "
        f"receivers waiting {args.receiver_ms:g} ms (inbox receiver {args.effect_ms:g} ms), "
        f"faults {'none' if args.no_faults else ', '.join(plan.kinds)}"
        f"{f'; relay {args.relay}' if args.relay else ''}; logs in {tmp}",
        flush=True,
    )
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    broker = Broker(tmp) if args.relay else None
    if broker:
        print(f"relay: exchange and queue {broker.name} on {broker.host}:{broker.port}", flush=True)
    try:
        info = runner.execute(plan, tmp, inject_faults=not args.no_faults, broker=broker)
    finally:  # the queue read back, and removed, whatever happened
        received = broker.finish() if broker else None
    started = time.monotonic()
    result = checker.check(info)
    if received is not None:
        result.update(consumer.check(info, received, tmp))
    result.update(
        check_seconds=round(time.monotonic() - started, 1),
        load_average=load,
        load_average_end=" ".join(f"{x:.1f}" for x in os.getloadavg()),
        lease_seconds=info["lease_seconds"],
        graceful_timeout_s=info["graceful_timeout_s"],
        finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **_shape(args, plan),
    )
    (tmp / "faults.json").write_text(json.dumps({"info": info, "result": result}, indent=1))
    print(report.publish(args.name or _name(args), args.db, result))
    found = report.problems(result)
    for problem in found:
        print(f"FAIL: {problem}", flush=True)
    if result["unexplained_examples"]:
        print(f"unexplained duplicates: see {tmp / 'faults.json'}")
    return 1 if found else 0


def _plan(args: argparse.Namespace) -> Any:
    from stress import runner
    from stress.faults import RELAY_KINDS

    kinds = args.faults or (list(RELAY_KINDS) if args.relay else None)
    return (runner.SHORT if args.short else runner.FULL).but(
        args.messages,
        kinds,
        args.fault_every,
        seconds=args.write_seconds,
        writers=args.writers,
        drainers=args.drainers,
        drain_after=args.drain_after,
        fault_backlog=args.fault_backlog,
        prefill=args.prefill,
    )


def _shape(args: argparse.Namespace, plan: Any) -> dict[str, Any]:
    """The run's shape, for the results."""
    return {
        "plan": plan.name,
        "concurrency": args.concurrency,
        "writers": plan.writers,
        "drainers": plan.drainers,
        "drain_after_s": plan.drain_after,
        "fault_backlog": plan.fault_backlog,
        "prefill": plan.prefill,
        "unsettled_seconds": _unsettled(),
        "receiver_ms": args.receiver_ms,
        "effect_ms": args.effect_ms,
        "fault_kinds": [] if args.no_faults else list(plan.kinds),
        "relay": args.relay or "",
    }


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stress")
    parser.add_argument("--db", choices=["postgres", "mariadb"], default="postgres")
    parser.add_argument("--short", action="store_true", help="a few thousand messages")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--messages", type=int, help="this many (at the plan's pace)")
    parser.add_argument("--faults", type=_kinds, help="comma-separated kinds, e.g. kill")
    parser.add_argument("--fault-every", type=float, help="seconds between faults")
    parser.add_argument("--write-seconds", type=float, help="writers spread the messages over")
    parser.add_argument("--writers", type=int, help="writer processes (2)")
    parser.add_argument("--drainers", type=int, help="drain_outboxes --loop processes (4)")
    parser.add_argument("--prefill", type=int, help="of the messages, N committed in bulk first")
    parser.add_argument("--drain-after", type=float, help="drainers start S s after the writers")
    parser.add_argument(
        "--fault-backlog", type=int, help="faults while N rows pend (not while writing)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="slots per drainer (OUTBOX_CONCURRENCY)"
    )
    parser.add_argument(
        "--receiver-ms", type=float, default=2.0, help="how long every receiver call waits"
    )
    parser.add_argument(
        "--effect-ms",
        type=float,
        default=0.0,
        help="how long the inbox receiver waits inside its transaction (drainers)",
    )
    parser.add_argument(
        "--relay", choices=["amqp"], help="also publish through this relay, checked at its consumer"
    )
    parser.add_argument("--name", help="results file name (default: from the options)")
    return parser.parse_args()


def _kinds(text: str) -> list[str]:
    from stress.faults import ALL_KINDS

    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in ALL_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"fault kinds are {', '.join(ALL_KINDS)}")
    return kinds


def _name(args: argparse.Namespace) -> str:
    """`latest` (full), `short`; only some fault kinds: `kill` (full), `short-kill`; then
    `-relay-amqp` for the relay leg (`relay-amqp` for its full run), `-nofaults`
    without faults."""
    name = "short" if args.short else "latest"
    if args.faults:
        kinds = "-".join(args.faults)
        name = f"short-{kinds}" if args.short else kinds
    if args.relay:
        name = f"relay-{args.relay}" if name == "latest" else f"{name}-relay-{args.relay}"
    return f"{name}-nofaults" if args.no_faults else name


def _unsettled() -> float:
    """OUTBOX_UNSETTLED_SECONDS of the drainers (STRESS_UNSETTLED_SECONDS, else the
    default)."""
    from outbox.conf import outbox_settings

    return float(getattr(outbox_settings, "UNSETTLED_SECONDS", 0.0))


def _setup() -> None:
    from stress import db

    db.create_database(os.environ["STRESS_DB_NAME"])
    migrate = ["-m", "django", "migrate", "-v", "0", "--settings=stress.settings", "--pythonpath=."]
    subprocess.run([sys.executable, *migrate], cwd=ROOT, check=True)
    import django

    django.setup()


if __name__ == "__main__":
    raise SystemExit(main())
