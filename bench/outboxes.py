"""Scopes and categories of the benchmark, one category per workload shape.

Values start at 900 so they never clash with a project's own; the bench settings load
only `outbox` and this app anyway.
"""

from __future__ import annotations

from outbox import OutboxCategory, OutboxScope


class BenchCategory(OutboxCategory):
    AUDIT_EVENT = 901  # one message per shard
    STREAM_UPDATE = 902  # ordered streams: many objects per shard, one message each
    OBJECT_UPDATE = 903  # heavy coalescing: many updates per object
    SYNC_FLUSH = 904  # synchronous flush latency
    ITEM_UPDATE = 905  # write overhead
    WAIT_SYNC = 906  # receivers that wait: a sync receiver sleeping (bench.waiting)
    WAIT_ASYNC = 907  # receivers that wait: an `async def` receiver awaiting a sleep
    RELAY_PUBLISH = 908  # relays (bench.relays): every message published by a relay


class BenchScope(OutboxScope):
    AUDIT = 900, {BenchCategory.AUDIT_EVENT}
    STREAM = 901, {BenchCategory.STREAM_UPDATE}
    OBJECT = 902, {BenchCategory.OBJECT_UPDATE, BenchCategory.ITEM_UPDATE}
    SYNC = 903, {BenchCategory.SYNC_FLUSH}
    WAIT = 904, {BenchCategory.WAIT_SYNC, BenchCategory.WAIT_ASYNC}
    RELAY = 905, {BenchCategory.RELAY_PUBLISH}
