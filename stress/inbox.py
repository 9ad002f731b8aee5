"""The opt-in receiver of the stress run: an `outbox.inbox_receiver` beside the journaling
one, for both stress categories.

Each call inserts one `Effect` row (message id, group, seq, attempt, process) in the
transaction of its inbox record, then waits STRESS_EFFECT_MS (in drainers) inside that
transaction, so a drainer killed mid-call rolls both back. A delivery the inbox skips
(`duplicate_skipped`) inserts a `Skip` row in the transaction that found the record.
The journaling receiver (`stress/receivers.py`) is connected first, so it runs first.
"""

from __future__ import annotations

import os
import time
from typing import Any

from outbox import inbox_receiver
from outbox.signals import duplicate_skipped, process_region_outbox
from stress.outboxes import StressCategory
from stress.receivers import DRAINER, PROCESS

EFFECT_SECONDS = float(os.environ.get("STRESS_EFFECT_MS", "0")) / 1000


def apply(
    sender: Any,
    message_id: Any,
    using: str,
    payload: dict[str, Any],
    shard_identifier: int,
    object_identifier: int,
    attempt: int,
    **kwargs: Any,
) -> None:
    """The effect: one row per call, in the inbox record's transaction."""
    from stress.models import Effect

    Effect.objects.using(using).create(
        message_id=message_id,
        shard=int(shard_identifier),
        category=int(sender),
        obj=int(object_identifier),
        seq=int(payload["seq"]),
        attempt=attempt,
        process=PROCESS,
        pid=os.getpid(),
        at=time.time(),
    )
    if EFFECT_SECONDS and DRAINER:
        time.sleep(EFFECT_SECONDS)  # still inside the transaction: a kill rolls it back


def _skipped(sender: Any, message_id: Any, using: str, **kwargs: Any) -> None:
    from stress.models import Skip

    Skip.objects.using(using).create(message_id=message_id, process=PROCESS, at=time.time())


def connect() -> None:
    from outbox.models import InboxRecord

    for category in (StressCategory.COALESCING, StressCategory.DISTINCT):
        name = f"stress.inbox.apply.{int(category)}"
        inbox_receiver(process_region_outbox, sender=category, name=name)(apply)
    duplicate_skipped.connect(_skipped, sender=InboxRecord, dispatch_uid="stress-inbox-skip")
