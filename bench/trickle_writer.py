"""A writer of the trickle section (`bench.trickle`): a script that each side's own
interpreter runs, `python bench/trickle_writer.py INDEX WRITERS SHARDS RATE SECONDS TAG`,
with PYTHONPATH set to the side's tree (and PYTHONSAFEPATH), so it imports that tree's
`outbox` and `bench` (`bench.settings`, `bench.outboxes`), and with OUTBOX_BENCH_DB
naming the side's database.

It starts Django and connects, then says so on stdout (a JSON line naming the `outbox`
file it imported), waits for a line `{"go": EPOCH}` on stdin, and from that moment
commits one message per transaction, as `bench.sustained_writer` does:
`outbox_context(transaction.atomic(), flush=False)` around one `RegionOutbox.save()`,
noting `time.time()` as the commit returns. The writers together keep to RATE commits a
second on a fixed schedule (writer INDEX of WRITERS takes every WRITERS-th slot; one that
falls behind writes flat out until it has caught up) for SECONDS; consecutive messages
of all writers go to consecutive shards, one message per shard over SHARDS shards. At the
end it prints `{"messages": N, "commits": [[object_identifier, time], ...]}`.
"""

from __future__ import annotations

import json
import sys
import time

# object_identifier = tag + writer index << WRITER_BITS + n (bench.sustained_writer's)
WRITER_BITS = 32


def main(index: int, writers: int, shards: int, rate: float, seconds: float, tag: int) -> None:
    import django

    django.setup()
    from django.db import connection, transaction

    import outbox
    from bench.outboxes import BenchCategory, BenchScope
    from outbox import outbox_context
    from outbox.models import RegionOutbox

    connection.ensure_connection()
    print(json.dumps({"outbox_file": outbox.__file__}), flush=True)
    go = float(json.loads(sys.stdin.readline())["go"])
    spacing = 1.0 / rate
    commits: list[tuple[int, float]] = []
    n = 0
    time.sleep(max(0.0, go - time.time()))
    start = time.perf_counter()
    while True:
        due = start + (n * writers + index) * spacing
        if due - start >= seconds:
            break
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        identifier = tag + (index << WRITER_BITS) + n
        with outbox_context(transaction.atomic(), flush=False):
            RegionOutbox(
                shard_scope=BenchScope.AUDIT,
                shard_identifier=(n * writers + index) % shards + 1,
                category=BenchCategory.AUDIT_EVENT,
                object_identifier=identifier,
                payload={"n": n},
            ).save()
        commits.append((identifier, time.time()))
        n += 1
    print(json.dumps({"messages": n, "commits": commits}), flush=True)


if __name__ == "__main__":
    index, writers, shards = (int(value) for value in sys.argv[1:4])
    main(index, writers, shards, float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
