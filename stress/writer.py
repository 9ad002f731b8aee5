"""A writer process: commits outbox messages with their `Written` record, sometimes rolls
back, and stalls inside a transaction when the runner asks (so it can be SIGKILLed there).

`python -m stress.writer INDEX WRITERS GENERATION SHARDS MESSAGES SECONDS`. Writer INDEX
owns the shards s with s % WRITERS == INDEX, so each shard's commit order is this
process's order. Sequence numbers start at GENERATION * 1e9, so a restarted writer keeps
them increasing.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

ROLLBACK_RATE = 0.05
COALESCING_RATE = 0.7
OBJECTS_PER_SHARD = 3


class _Rollback(Exception):
    pass


def main(argv: list[str]) -> int:
    index, writers, generation, shards, messages = (int(a) for a in argv[:5])
    seconds = float(argv[5])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stress.settings")
    import django

    django.setup()
    from django.db import transaction

    from outbox import outbox_context
    from outbox.categories import unique_object_identifier
    from outbox.models import RegionOutbox
    from stress.models import Control, Written
    from stress.outboxes import StressCategory, StressScope

    stall_marker = Path(os.environ["STRESS_TMP"]) / f"writer-{index}.stall"
    owned = [s for s in range(1, shards + 1) if s % writers == index]
    rng = random.Random(f"{index}-{generation}")
    base = generation * 1_000_000_000
    seq = base
    sseq: dict[int, int] = {s: base for s in owned}
    already = Written.objects.filter(shard__in=owned).count()
    target = messages // writers - already
    rate = max(target, 1) / seconds
    started = time.monotonic()
    committed = 0
    check_at = 0.0
    stall = False
    deadline = started + seconds * 4 + 60
    while committed < target and time.monotonic() < deadline:
        if time.monotonic() > check_at:
            check_at = time.monotonic() + 0.3
            stall = Control.objects.filter(kind="stall", used=False).exists()
        shard = rng.choice(owned)
        count = rng.randint(1, 3)
        rollback = rng.random() < ROLLBACK_RATE
        try:
            with outbox_context(transaction.atomic(), flush=False):
                for _ in range(count):
                    seq += 1
                    sseq[shard] += 1
                    if rng.random() < COALESCING_RATE:
                        category = StressCategory.COALESCING
                        obj = shard * 10 + rng.randrange(OBJECTS_PER_SHARD)
                    else:
                        category, obj = StressCategory.DISTINCT, unique_object_identifier()
                    RegionOutbox(
                        shard_scope=StressScope.STRESS,
                        shard_identifier=shard,
                        category=category,
                        object_identifier=obj,
                        payload={"seq": seq, "sseq": sseq[shard]},
                    ).save()
                    Written.objects.create(
                        shard=shard,
                        category=int(category),
                        obj=obj,
                        seq=seq,
                        sseq=sseq[shard],
                        at=time.time(),
                    )
                if stall:
                    stall_marker.touch()
                    time.sleep(120)  # the runner SIGKILLs us here
                if rollback:
                    raise _Rollback
        except _Rollback:
            continue
        committed += count
        ahead = committed / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(min(ahead, 1.0))
    print(f"writer {index} gen {generation}: committed {committed} messages", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
