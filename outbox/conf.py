"""The app's settings: every ``OUTBOX_*`` setting, its type and its default.

Values are read from ``django.conf.settings`` on every access, so
``override_settings`` works in tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings


@dataclass(frozen=True)
class Setting:
    default: Any
    doc: str


SETTINGS: dict[str, Setting] = {
    "LEASE_SECONDS": Setting(
        60.0,
        "How long a claimed shard stays leased without renewal. A live worker renews its "
        "leases every third of this; a dead one blocks its shards at most this long.",
    ),
    "RECEIVER_DEADLINE_SECONDS": Setting(
        600.0,
        "After a single receiver call has run this long, its lease is no longer renewed, "
        "so the shard is released to other workers when the lease expires.",
    ),
    "BATCH_SHARDS": Setting(100, "How many due shards one worker claims at once."),
    "BATCH_ROWS": Setting(
        2000, "How many rows one read of the claimed shards fetches (coalescing window)."
    ),
    "BACKOFF_BASE_SECONDS": Setting(
        2.0, "Delay before the first retry of a failed row; doubled per attempt."
    ),
    "BACKOFF_MAX_SECONDS": Setting(900.0, "Cap of the retry delay."),
    "FLUSH_STRICT": Setting(
        False,
        "Re-raise errors of the synchronous flush after commit instead of logging them "
        "and leaving the rows to the drain. Meant for tests.",
    ),
    "REQUIRE_CONTEXT": Setting(False, "Refuse to save outbox rows outside any `outbox_context`."),
    "MAX_PAYLOAD_BYTES": Setting(
        1_000_000, "Largest accepted payload, measured as its JSON encoding in UTF-8."
    ),
    "DEFER_WRITES": Setting(
        True,
        "Hold the outbox rows saved inside an `outbox_context` that opens the outermost "
        "transaction, and write them in one statement as it commits (on PostgreSQL with "
        "psycopg 3, in the COMMIT's round trip). Until then they have no primary key and "
        "are not visible to queries in the block. Off, every save INSERTs at once.",
    ),
    "FAST_PATH": Setting(
        True,
        "Use the PostgreSQL fast path on PostgreSQL. Off, PostgreSQL takes the portable "
        "path like every other database.",
    ),
    "LOOP_INTERVAL_SECONDS": Setting(
        1.0, "How long `drain_outboxes --loop` sleeps when nothing is due."
    ),
    "GRACEFUL_TIMEOUT_SECONDS": Setting(
        30.0,
        "After SIGTERM/SIGINT to `drain_outboxes` or a Celery warm shutdown: how long the "
        "receiver in flight may still run. Past it the drain stops anyway and that shard's "
        "lease expires normally.",
    ),
    "PROMPT_DRAIN": Setting(
        None,
        "Dotted path of a callable run after a commit that left outbox rows to the drain "
        "(`flush=False`, or no `outbox_context`), with the database alias and the written "
        "shards per table: `outbox.integrations.celery.prompt_drain` or "
        "`outbox.integrations.django_tasks.prompt_drain` enqueue a drain of those shards.",
    ),
    "TASK_SHARDS": Setting(50, "Most shards one drain task (Celery or Django Tasks) is given."),
    "TASK_SECONDS": Setting(
        60.0,
        "Time budget of one drain task: past it, the task finishes the receiver in flight, "
        "releases its other shards and returns.",
    ),
    "CELERY_SCHEDULE_TASK": Setting(
        "outbox.schedule_drains", "Name of the Celery task that fans due shards out."
    ),
    "CELERY_DRAIN_TASK": Setting("outbox.drain", "Name of the Celery task that drains shards."),
    "CELERY_QUEUE": Setting(
        None, "Queue of the outbox Celery tasks; `None` uses Celery's routing (default queue)."
    ),
    "CELERY_SCHEDULE_SECONDS": Setting(
        5.0, "Interval of the beat entry that `add_beat_schedule()` adds."
    ),
    "CELERY_MAX_TASKS": Setting(
        20,
        "Per outbox table, most drain tasks queued or running at once: the scheduler keeps "
        "the shards in flight (live leases) under this times `OUTBOX_TASK_SHARDS`.",
    ),
    "CELERY_TIME_LIMIT_SECONDS": Setting(
        900.0,
        "Celery hard time limit of a drain task: a worker process stuck past it is killed, "
        "and its shards' leases expire.",
    ),
    "TASKS_BACKEND": Setting("default", "Django Tasks backend alias of the outbox tasks."),
    "TASKS_QUEUE_NAME": Setting("default", "Django Tasks queue of the outbox tasks."),
}


class OutboxSettings:
    """Attribute access to the settings, e.g. ``outbox_settings.LEASE_SECONDS``."""

    def __getattr__(self, name: str) -> Any:
        try:
            setting = SETTINGS[name]
        except KeyError:
            raise AttributeError(f"unknown outbox setting {name!r}") from None
        return getattr(django_settings, f"OUTBOX_{name}", setting.default)


outbox_settings = OutboxSettings()
