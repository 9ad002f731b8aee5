"""How the outboxes are doing, for the status command, the admin, metrics and probes:

- `outbox.health.snapshot`: the backlog per table and scope (pending, due, lag, failing,
  dead letters, shards by lease state), read in a fixed number of queries.
- `outbox.health.vacuum`: on PostgreSQL, what holds vacuum back and each table's dead rows.
- `outbox.health.thresholds`: the limits that turn those readings into problems, in words
  (`check`, `Thresholds`), as `outbox_status --max-...` and the health check apply them.
"""

from outbox.health.thresholds import Thresholds, backlog, check, problems, statuses

__all__ = ["Thresholds", "backlog", "check", "problems", "statuses"]
