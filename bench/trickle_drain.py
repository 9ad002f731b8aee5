"""The drain of the trickle section (`bench.trickle`): a script that each side's own
interpreter runs, `python bench/trickle_drain.py`, with PYTHONPATH set to the side's
tree (and PYTHONSAFEPATH, so this folder stays off sys.path), so that it imports that
tree's `outbox` and `bench`. It is `python -m django drain_outboxes --loop
--progress-every 0` with the side's `bench.sustained_settings` (its receiver probe notes
when each message's receiver starts), plus two things the harness reads:

- OUTBOX_BENCH_TRICKLE_HELLO: a JSON file, written before Django starts, naming the
  `outbox` file this process imported and the versions it runs on;
- OUTBOX_BENCH_TRICKLE_STATEMENTS: every STATEMENTS_EVERY_S, a line `time.time() count`,
  the statements this process has sent through psycopg so far: calls of
  `Cursor.execute` / `executemany` and `Connection.commit` / `rollback` (Django's
  connections and any the engine opens itself). The count wraps those four methods;
  the wrapper costs about a microsecond a statement;
- OUTBOX_BENCH_TRICKLE_TIMINGS: at exit, a JSON list of those statements with their
  calls and wall time (from the call to its return: the round trip and the server's
  work, and psycopg's on both ends), over the process's life.

It imports nothing from this tree's `bench`: on the baseline's side that would be the
baseline's.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

STATEMENTS_EVERY_S = 0.2

_statements = itertools.count()  # next() is atomic under the GIL; read through repr()


# statement -> [calls, seconds]: keyed by the statement's text (the engine's are
# constants, whose hash Python keeps), or by the method for commit and rollback.
_timings: dict[Any, list[Any]] = {}


def _count(method: Callable[..., Any]) -> Callable[..., Any]:
    name = method.__name__.upper()

    @functools.wraps(method)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        next(_statements)
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            key = args[0] if args and isinstance(args[0], str) else name
            entry = _timings.get(key)
            if entry is None:
                entry = _timings[key] = [0, 0.0]
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    return counted


def _write_timings(path: str) -> None:
    """Each statement's calls and wall time over the process's life, the costliest first
    (a statement's text shortened to its start)."""
    rows = [
        {"statement": " ".join(str(key).split())[:160], "calls": calls, "seconds": seconds}
        for key, (calls, seconds) in list(_timings.items())
    ]
    rows.sort(key=lambda row: -row["seconds"])
    with open(path, "w", encoding="utf-8") as out:
        json.dump(rows, out)


def _sent() -> int:
    return int(repr(_statements)[len("count(") : -1])


def _note_statements(path: str) -> None:
    with open(path, "a", encoding="ascii") as out:
        while True:
            out.write(f"{time.time():.6f} {_sent()}\n")
            out.flush()
            time.sleep(STATEMENTS_EVERY_S)


def main() -> None:
    for cls, names in (
        (psycopg.Cursor, ("execute", "executemany")),
        (psycopg.Connection, ("commit", "rollback")),
    ):
        for name in names:
            setattr(cls, name, _count(getattr(cls, name)))
    import django

    import outbox

    hello = {
        "outbox_file": outbox.__file__,
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "pid": os.getpid(),
    }
    with open(os.environ["OUTBOX_BENCH_TRICKLE_HELLO"], "w", encoding="utf-8") as out:
        json.dump(hello, out)
    atexit.register(_write_timings, os.environ["OUTBOX_BENCH_TRICKLE_TIMINGS"])
    threading.Thread(
        target=_note_statements,
        args=(os.environ["OUTBOX_BENCH_TRICKLE_STATEMENTS"],),
        name="trickle-statements",
        daemon=True,
    ).start()
    from django.core.management import execute_from_command_line

    execute_from_command_line(
        [sys.argv[0], "drain_outboxes", "--loop", "--progress-every", "0", *sys.argv[1:]]
    )


if __name__ == "__main__":
    main()
