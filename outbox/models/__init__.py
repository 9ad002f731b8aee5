"""Outbox tables (the abstract base, the two stock tables), the shard lease table, the
pauses and the drain processes.

This layer never imports the write path or the engine: rows hand their saves to the
write path through `OutboxBase.write_path`, which the app installs when it is ready.
"""

from outbox.models.drains import OutboxDrainMinute, OutboxDrainProcess, OutboxDrainProcessQuerySet
from outbox.models.inbox_records import InboxRecord, InboxRecordQuerySet
from outbox.models.lease import ShardLease, ShardLeaseQuerySet, any_shard
from outbox.models.outbox import (
    ControlOutbox,
    OutboxBase,
    OutboxQuerySet,
    RegionOutbox,
    outbox_models,
)
from outbox.models.pause import OutboxPause, OutboxPauseQuerySet, PausedPart
from outbox.models.write_path import WritePath

__all__ = [
    "ControlOutbox",
    "InboxRecord",
    "InboxRecordQuerySet",
    "OutboxBase",
    "OutboxDrainMinute",
    "OutboxDrainProcess",
    "OutboxDrainProcessQuerySet",
    "OutboxPause",
    "OutboxPauseQuerySet",
    "OutboxQuerySet",
    "PausedPart",
    "RegionOutbox",
    "ShardLease",
    "ShardLeaseQuerySet",
    "WritePath",
    "any_shard",
    "outbox_models",
]
