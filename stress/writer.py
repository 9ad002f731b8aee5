"""A writer process: commits outbox messages with their `Written` record, sometimes rolls
back, flushes some transactions synchronously after commit (racing the drainers for the
shard), and stalls inside a transaction when the runner asks (so it can be SIGKILLed
there).

`python -m stress.writer INDEX WRITERS GENERATION SHARDS MESSAGES UNTIL`. Writer INDEX
owns the shards s with s % WRITERS == INDEX, so each shard's commit order is this
process's order. It spreads its share of MESSAGES evenly until UNTIL (epoch seconds), so
a restarted writer keeps the run's pace. Sequence numbers start at GENERATION * 1e9, so
a restarted writer keeps them increasing. `prefill` commits a backlog in bulk first
(generation 0 of every writer).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

ROLLBACK_RATE = 0.05
FLUSH_RATE = 0.2  # transactions flushed right after commit: outbox_context(flush=True)
COALESCING_RATE = 0.7
OBJECTS_PER_SHARD = 3


class _Rollback(Exception):
    pass


class Writer:
    """One writer's state: its shards, sequence numbers and random choices."""

    def __init__(self, index: int, writers: int, generation: int, shards: int) -> None:
        self.index = index
        self.owned = [s for s in range(1, shards + 1) if s % writers == index]
        self.rng = random.Random(f"{index}-{generation}")
        self.seq = generation * 1_000_000_000
        self.sseq = dict.fromkeys(self.owned, self.seq)
        self.stall_marker = Path(os.environ.get("STRESS_TMP", ".")) / f"writer-{index}.stall"

    def transaction(self, stall: bool) -> int:
        """Commit (or roll back) 1 to 3 messages of one shard; how many committed."""
        from django.db import transaction

        from outbox import outbox_context

        shard = self.rng.choice(self.owned)
        count = self.rng.randint(1, 3)
        rollback = self.rng.random() < ROLLBACK_RATE
        flush = self.rng.random() < FLUSH_RATE
        try:
            with outbox_context(transaction.atomic(), flush=flush):
                for _ in range(count):
                    self._write(shard)
                if stall:
                    self.stall_marker.touch()
                    time.sleep(120)  # the runner SIGKILLs us here
                if rollback:
                    raise _Rollback
        except _Rollback:
            return 0
        return count

    def _write(self, shard: int) -> None:
        row, written = self._rows(shard)
        row.save()
        written.at = time.time()
        written.save()

    def _rows(self, shard: int) -> tuple[Any, Any]:
        """The next message of this shard: its outbox row and its `Written` record."""
        from outbox.categories import unique_object_identifier
        from outbox.models import RegionOutbox
        from stress.models import Written
        from stress.outboxes import StressCategory, StressScope

        self.seq += 1
        self.sseq[shard] += 1
        if self.rng.random() < COALESCING_RATE:
            category = StressCategory.COALESCING
            obj = shard * 10 + self.rng.randrange(OBJECTS_PER_SHARD)
        else:
            category, obj = StressCategory.DISTINCT, unique_object_identifier()
        payload = {"seq": self.seq, "sseq": self.sseq[shard]}
        row = RegionOutbox(
            shard_scope=StressScope.STRESS,
            shard_identifier=shard,
            category=category,
            object_identifier=obj,
            payload=payload,
        )
        written = Written(shard=shard, category=int(category), obj=obj, at=0.0, **payload)
        return row, written


def prefill(writers: int, shards: int, messages: int, chunk: int = 1000) -> None:
    """Commit `messages` in bulk (`chunk` per transaction) as generation 0 of each writer,
    before any drainer runs: a backlog to start from. The writers then start at
    generation 1, so their sequence numbers follow these."""
    from django.db import transaction

    from outbox.models import RegionOutbox
    from stress.models import Written

    for index in range(writers):
        writer = Writer(index, writers, 0, shards)
        left = messages // writers
        while left > 0:
            pairs = [writer._rows(writer.rng.choice(writer.owned)) for _ in range(min(chunk, left))]
            with transaction.atomic():
                RegionOutbox.objects.bulk_create([row for row, _ in pairs])
                at = time.time()
                for _, written in pairs:
                    written.at = at
                Written.objects.bulk_create([written for _, written in pairs])
            left -= len(pairs)


def main(argv: list[str]) -> int:
    index, writers, generation, shards, messages = (int(a) for a in argv[:5])
    seconds = max(float(argv[5]) - time.time(), 5.0)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stress.settings")
    import django

    django.setup()
    from stress.models import Control, Written

    writer = Writer(index, writers, generation, shards)
    already = Written.objects.filter(shard__in=writer.owned).count()
    target = messages // writers - already
    rate = max(target, 1) / seconds
    started = time.monotonic()
    deadline = started + seconds * 4 + 300
    committed = 0
    check_at = 0.0
    stall = False
    while committed < target and time.monotonic() < deadline:
        if time.monotonic() > check_at:
            check_at = time.monotonic() + 0.3
            stall = Control.objects.filter(kind="stall", shard=index, used=False).exists()
        committed += writer.transaction(stall)
        ahead = committed / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))
    print(f"writer {index} gen {generation}: committed {committed} messages", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
