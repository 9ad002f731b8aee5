"""`python -m stress [--db postgres|mariadb] [--short] [--no-faults]`: run, check, report.

Writes stress/results/<name>.json (one object per database, merged with earlier runs)
and <name>.md; <name> is `latest` for a full run, `short` for --short. Exits 1 when
anything was lost, reordered or overlapped.
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "stress" / "results"
KEYS = [
    "messages",
    "faults",
    "lost",
    "order_violations",
    "overlaps",
    "duplicates",
    "slowest_recovery_s",
]
EXTRA = [
    "phantoms",
    "order_unverified",
    "hung_overlaps",
    "receiver_calls",
    "restarts",
    "crashes",
    "seconds",
    "drained",
]


def main() -> int:
    parser = argparse.ArgumentParser(prog="stress")
    parser.add_argument("--db", choices=["postgres", "mariadb"], default="postgres")
    parser.add_argument("--short", action="store_true", help="a few thousand messages")
    parser.add_argument("--no-faults", action="store_true")
    args = parser.parse_args()
    os.environ["STRESS_DB"] = args.db
    os.environ.setdefault("STRESS_DB_NAME", "outbox_stress")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stress.settings")
    from stress import db

    db.create_database(os.environ["STRESS_DB_NAME"])
    subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "migrate",
            "-v",
            "0",
            "--settings=stress.settings",
            "--pythonpath=.",
        ],
        cwd=ROOT,
        check=True,
    )
    import django

    django.setup()
    from stress import checker, runner

    db.reset()
    plan = runner.SHORT if args.short else runner.FULL
    name = "short" if args.short else "latest"
    if args.no_faults:
        name += "-nofaults"
    tmp = Path(tempfile.mkdtemp(prefix=f"stress-{args.db}-"))
    print(
        f"stress {plan.name} on {args.db}: {plan.messages} messages, {plan.shards} shards, "
        f"{plan.writers} writers, {runner.DRAINERS} drainers; logs in {tmp}",
        flush=True,
    )
    info = runner.execute(plan, tmp, faults=not args.no_faults)
    started = time.monotonic()
    result = checker.check(info)
    result["check_seconds"] = round(time.monotonic() - started, 1)
    (tmp / "faults.json").write_text(json.dumps(info, indent=1))
    _publish(name, args.db, result)
    bad = result["lost"] + result["phantoms"] + result["order_violations"] + result["overlaps"]
    if args.no_faults:
        bad += result["duplicates"]
    return 1 if bad or not result["drained"] else 0


def _publish(name: str, database: str, result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged[database] = result
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    columns = KEYS + EXTRA
    lines = ["| database | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for db_name, row in sorted(merged.items()):
        lines.append(f"| {db_name} | " + " | ".join(str(row.get(k, "")) for k in columns) + " |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(f"# Stress run `{name}`\n\n{table}")
    print(table)


if __name__ == "__main__":
    raise SystemExit(main())
