"""Categories and scope of the stress run (values chosen not to clash with projects)."""

from __future__ import annotations

from outbox import OutboxCategory, OutboxScope


class StressCategory(OutboxCategory):
    COALESCING = 801  # a few objects per shard, rewritten over and over
    DISTINCT = 802  # a fresh object per message: never coalesces


class StressScope(OutboxScope):
    STRESS = 800, {StressCategory.COALESCING, StressCategory.DISTINCT}
