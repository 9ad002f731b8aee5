"""MariaDB: the engine's fast path against MariaDB's own raw-SQL limit, on the same rows.

The harness runs with PostgreSQL settings, so this section runs in a child process
(`python -m bench.mariadb MODE`, settings `bench.settings_mariadb`). The child recreates
its database, then for each shape (ordered streams, one message per shard) loads the
same rows before each contender and drains them, one contender after the other:

- raw limit (`bench/contenders/mariadb_raw.py`): MySQLdb alone, the same batch, a trivial
  function per row given the decoded payload (as psycopg decodes it on PostgreSQL); the
  faster of a `FOR UPDATE SKIP LOCKED` claim + DELETE + COMMIT and
  one `DELETE ... ORDER BY id LIMIT n RETURNING` per batch (MariaDB cannot DELETE by a
  subquery with LIMIT);
- leased floor (`raw_leased` there): that SKIP LOCKED loop plus one `ShardLease` row per
  shard, committed before the receiver runs and deleted with the rows;
- drain: `drain_outboxes()` until the table is empty (`bench/contenders/drain.py`), on
  the MariaDB fast path, in this process and in two fresh ones at once
  (`bench.workers`); and in this process on the portable path, for comparison.

Times are the contender's own run (`time.perf_counter()` around it, or the workers'
first start to last finish); loading is not measured. Rows retired are counted from the
database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TITLE = "MariaDB: the fast path against MariaDB's raw limit"

# mode: (ordered streams (shards, objects per shard), one-per-shard rows, budget seconds)
SIZES: dict[str, tuple[tuple[int, int], tuple[int, ...], float]] = {
    "smoke": ((10, 10), (100,), 20.0),
    "quick": ((100, 100), (10_000, 2_000), 30.0),
    "full": ((1_000, 100), (100_000, 20_000), 60.0),
}
RAW = ("raw_skip_locked", "raw_delete_returning", "raw_leased")  # bench.contenders.mariadb_raw
CONTENDERS = (*RAW, "drain_1p", "drain_2p", "drain_portable")


def measure(mode: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Run the section in a child process with the MariaDB settings; its progress goes
    to `log`, its results come back as JSON."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings_mariadb"}
    if mode == "smoke":
        env.setdefault("OUTBOX_BENCH_MARIADB_DB", "outbox_bench_smoke")
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.mariadb", mode],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        last = ""
        assert child.stderr is not None
        for line in child.stderr:
            last = line.rstrip() or last
            log(f"mariadb: {last}")
        status = child.wait()
        out.seek(0)
        text = out.read().strip()
    if status == 0 and text:
        result: dict[str, Any] = json.loads(text.splitlines()[-1])
        return result
    problem = f"mariadb section failed (exit status {status}): {last}"
    return {"skipped": problem, "problems": [problem]}


def markdown(result: dict[str, Any]) -> list[str]:
    versions = result["versions"]
    lines = [
        f"MariaDB {versions['mariadb']}, engine backend {versions['outbox_backend']}, "
        f"batch {result['batch_rows']} rows. Raw limit: the faster of a SKIP LOCKED "
        "transaction and one DELETE ... RETURNING per batch; leased floor: that SKIP LOCKED "
        "loop plus a lease row per shard (bench/contenders/mariadb_raw.py).",
        "",
        "| shape | rows | raw limit | leased floor | ÷ raw | fast path | ÷ raw | ÷ leased "
        "| 2 processes | portable path | ÷ raw |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in result["shapes"].values():
        described = shape["shape"]
        lines.append(
            f"| {described['title']} | {described['rows']:,} / {described['shards']:,} shards "
            f"| {_rate(shape['raw_limit_per_s'])} | {_rate(shape['leased_floor_per_s'])} "
            f"| {shape['leased_floor_ratio']:.2f} | {_rate(shape['drain_1p_per_s'])} "
            f"| {shape['ratio']:.2f} | {shape['drain_over_leased_floor']:.2f} "
            f"| {_rate(shape['drain_2p_per_s'])} | {_rate(shape['portable_per_s'])} "
            f"| {shape['portable_ratio']:.2f} |"
        )
    return lines


def _rate(per_s: float) -> str:
    return f"{per_s / 1000:.1f}k/s" if per_s >= 1000 else f"{per_s:.0f}/s"


# -- the child process --------------------------------------------------------------------


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _create_database() -> None:
    """Create the section's database afresh: it is scratch."""
    import MySQLdb
    from django.conf import settings

    config = settings.DATABASES["default"]
    server = MySQLdb.connect(
        host=config["HOST"],
        port=int(config["PORT"]),
        user=config["USER"],
        password=config["PASSWORD"],
        connect_timeout=10,
    )
    try:
        cursor = server.cursor()
        cursor.execute(f"DROP DATABASE IF EXISTS `{config['NAME']}`")
        cursor.execute(f"CREATE DATABASE `{config['NAME']}` CHARACTER SET utf8mb4")
    finally:
        server.close()


def _load(shape: Any) -> int:
    """Empty the tables and insert the rows of `shape` in one statement: the same rows
    as `bench.db.load_shape` on PostgreSQL (row g to shard g % shards)."""
    from django.db import connection

    from bench.db import LOADED_COLUMNS, _defaults
    from outbox.models import RegionOutbox, ShardLease

    table = RegionOutbox._meta.db_table
    extra = _defaults(RegionOutbox, set(LOADED_COLUMNS))
    columns = ", ".join(f"`{name}`" for name in [*LOADED_COLUMNS, *extra])
    values = ", ".join(f"%({name})s" for name in extra)
    statement = (
        f"INSERT INTO `{table}` ({columns}) SELECT %(scope)s, s.shard + 1, %(category)s, s.obj,"
        " JSON_OBJECT('object', s.obj, 'version', s.pos DIV %(objects)s, 'name',"
        f" CONCAT('o', s.obj)), {values} FROM ("
        "  SELECT seq AS g, MOD(seq, %(shards)s) AS shard, seq DIV %(shards)s AS pos,"
        "         MOD(seq, %(shards)s) * %(objects)s + MOD(seq DIV %(shards)s, %(objects)s) + 1"
        f"         AS obj FROM seq_0_to_{int(shape.rows) - 1}"
        ") AS s ORDER BY s.g"
    )
    params = {
        "scope": int(shape.scope),
        "category": int(shape.category),
        "shards": shape.shards,
        "objects": shape.objects_per_shard,
        **extra,
    }
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE TABLE `{table}`")
        cursor.execute(f"TRUNCATE TABLE `{ShardLease._meta.db_table}`")
        cursor.execute(statement, params)
        inserted = cursor.rowcount
        cursor.execute(f"ANALYZE TABLE `{table}`")
        cursor.fetchall()
    return int(inserted)


def _run(name: str, budget: float, batch_rows: int) -> tuple[dict[str, Any], float]:
    """Run a contender; its results and the seconds it took."""
    from django.test.utils import override_settings

    from bench import receivers
    from bench.contenders import drain, mariadb_raw
    from bench.workers import run_processes

    if name == "drain_2p":
        run = run_processes("bench.contenders.drain.run", 2, budget)
        calls = sum(result["receiver_calls"] for result in run.results)
        return {"receiver_calls": calls, "workers": run.results}, run.seconds
    receivers.calls.clear()
    started = time.perf_counter()
    if name in RAW:
        result = getattr(mariadb_raw, name)(budget, batch_rows)
    else:
        with override_settings(OUTBOX_FAST_PATH=name == "drain_1p"):
            result = drain.run(budget)
    return result, time.perf_counter() - started


def _contender(name: str, shape: Any, budget: float, batch_rows: int) -> dict[str, Any]:
    from outbox.models import RegionOutbox

    loaded = _load(shape)
    result, seconds = _run(name, budget, batch_rows)
    left = RegionOutbox.objects.count()
    retired = loaded - left
    return {
        **result,
        "rows_loaded": loaded,
        "rows_retired": retired,
        "rows_left": left,
        "complete": left == 0,
        "seconds": seconds,
        "per_s": retired / seconds if seconds else 0.0,
    }


def _shape(shape: Any, budget: float, batch_rows: int, problems: list[str]) -> dict[str, Any]:
    contenders = {}
    for name in CONTENDERS:
        run = contenders[name] = _contender(name, shape, budget, batch_rows)
        _note(f"{shape.name}: {name} {run['per_s']:,.0f}/s ({run['rows_retired']:,} rows)")
        if run["receiver_calls"] != run["rows_retired"]:  # no coalescing in these shapes
            problems.append(
                f"mariadb {shape.name} {name}: {run['receiver_calls']} receiver calls for "
                f"{run['rows_retired']} rows"
            )
    rate = {name: run["per_s"] for name, run in contenders.items()}
    raw = max(rate["raw_skip_locked"], rate["raw_delete_returning"])
    fast, two, leased = rate["drain_1p"], rate["drain_2p"], rate["raw_leased"]
    return {
        "shape": shape.describe(),
        "contenders": contenders,
        "raw_limit_per_s": raw,
        "drain_1p_per_s": fast,
        "ratio": fast / raw if raw else 0.0,
        "drain_2p_per_s": two,
        "drain_2p_over_drain_1p": two / fast if fast else 0.0,
        "portable_per_s": rate["drain_portable"],
        "portable_ratio": rate["drain_portable"] / raw if raw else 0.0,
        "leased_floor_per_s": leased,
        "leased_floor_ratio": leased / raw if raw else 0.0,
        "drain_over_leased_floor": fast / leased if leased else 0.0,
    }


def _versions() -> dict[str, Any]:
    from importlib import metadata

    from django.db import connection

    from outbox.backends import get_backend

    return {
        "mariadb": connection.mysql_server_info,  # SELECT VERSION(), as Django reads it
        "mysqlclient": metadata.version("mysqlclient"),
        "outbox_backend": type(get_backend("default")).__name__,
    }


def main(mode: str) -> dict[str, Any]:
    """The section, in the child process: results, or {"skipped": why}."""
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        return {"skipped": "mysqlclient is not installed (pip install -e '.[mysql]')"}
    import django

    django.setup()
    try:
        _create_database()
    except Exception as exc:  # no server here: say so instead of failing the run
        return {"skipped": f"no MariaDB server ({exc})"}
    from django.conf import settings
    from django.core.management import call_command

    from bench import shapes

    call_command("migrate", verbosity=0, interactive=False)
    streams, one_per_shard, budget = SIZES[mode]
    batch_rows = settings.OUTBOX_BATCH_ROWS
    shape_list = [shapes.ordered_streams(*streams), shapes.audit_log(one_per_shard[0])]
    shape_list += [shapes.audit_log(rows, f"_{rows // 1000}k") for rows in one_per_shard[1:]]
    problems: list[str] = []
    measured = {shape.name: _shape(shape, budget, batch_rows, problems) for shape in shape_list}
    if mode == "smoke":
        for name, shape in measured.items():
            problems += [
                f"mariadb {name} {contender}: incomplete"
                for contender, run in shape["contenders"].items()
                if not run["complete"]
            ]
    return {
        "versions": _versions(),
        "batch_rows": batch_rows,
        "budget_seconds": budget,
        "shapes": measured,
        "problems": problems,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
