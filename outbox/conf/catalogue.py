"""Every ``OUTBOX_*`` setting, its type, its default and its meaning.

Each is checked against its type and range when read: a bad value raises
`OutboxConfigurationError` naming the setting, instead of failing somewhere deeper
later. Values are read from ``django.conf.settings`` and kept until a setting changes,
so ``override_settings`` works (`outbox.conf.descriptor`). The system checks
(`outbox.checks.settings`) report the same problems at startup.
"""

from __future__ import annotations

from typing import Any

from outbox.conf.descriptor import Setting

__all__ = ["SETTINGS", "OutboxSettings", "outbox_settings"]


class OutboxSettings:
    """Typed attribute access to the settings, e.g. ``outbox_settings.LEASE_SECONDS``."""

    LEASE_SECONDS: Setting[float] = Setting(
        60.0,
        "How long a claimed shard stays leased without renewal. A live worker renews its "
        "leases every third of this; a dead one blocks its shards at most this long.",
        above=0,
    )
    RECEIVER_DEADLINE_SECONDS: Setting[float] = Setting(
        600.0,
        "After a single receiver call has run this long, its lease is no longer renewed, "
        "so the shard is released to other workers when the lease expires.",
        above=0,
    )
    CONCURRENCY: Setting[int] = Setting(
        4,
        "How many claimed shards one drain delivers at the same time, each on a thread "
        "with database connections of its own (one shard is still one call at a time, in "
        "order). A drain whose receivers return at once keeps delivering on one thread; "
        "the others join when calls take a millisecond or more. 1 delivers every "
        "shard on the drain's own thread, one call at a time. `drain_outboxes "
        "--concurrency` overrides it. The synchronous flush after commit always delivers "
        "in the committing thread.",
        at_least=1,
    )
    RECEIVER_TIMEOUT_SECONDS: Setting[float] = Setting(
        60.0,
        "With `OUTBOX_CONCURRENCY` above 1: an `async def` receiver call still running "
        "after this long is cancelled, and a sync one is given up (about half a second "
        "later; Python cannot stop it, so its thread is counted as stuck until it "
        "returns). Either counts as a failed attempt (`TimeoutError`): its rows are "
        "rescheduled with back-off and its shard's lease let go. 0: no timeout.",
        at_least=0,
    )
    MAX_STUCK_RECEIVERS: Setting[int] = Setting(
        8,
        "How many timed-out receiver calls may still be running in one drain before it "
        "gives up with `StuckReceivers` (`drain_outboxes` exits with status 5, so its "
        "supervisor can restart the process). 0: no limit.",
        at_least=0,
    )
    BATCH_SHARDS: Setting[int] = Setting(
        100,
        "How many due shards one worker claims at once, but never fewer than "
        "`OUTBOX_CONCURRENCY` (a shard for every slot). On PostgreSQL's fast path a drain "
        "whose shards hold only a row or two each claims more, up to `OUTBOX_BATCH_ROWS` "
        "shards per batch, so one message per shard costs the same round trips per message.",
        at_least=1,
    )
    BATCH_ROWS: Setting[int] = Setting(
        2000,
        "How many rows one read of the claimed shards fetches (coalescing window).",
        at_least=1,
    )
    UNSETTLED_SECONDS: Setting[float] = Setting(
        0.25,
        "With receivers that wait (calls of a millisecond or more): about how many "
        "seconds of delivered calls one drain holds before their rows are deleted. It "
        "claims the shards its receivers get through in half of this, so a drain that "
        "dies redelivers about this much. Receivers that return at once are not held "
        "to it.",
        above=0,
    )
    BACKOFF_BASE_SECONDS: Setting[float] = Setting(
        2.0, "Delay before the first retry of a failed row; doubled per attempt.", above=0
    )
    BACKOFF_MAX_SECONDS: Setting[float] = Setting(
        900.0,
        "Cap of the retry delay; at least `OUTBOX_BACKOFF_BASE_SECONDS`.",
        above=0,
    )
    FLUSH: Setting[bool] = Setting(
        True,
        "Default flush mode of an outermost `outbox_context` that does not say "
        "(`flush=None`), and so of producer models: True flushes its shards right after "
        "commit; False leaves the rows to the drain (and `OUTBOX_PROMPT_DRAIN`) unless "
        "a context passes `flush=True`. Nested contexts inherit the enclosing choice.",
    )
    FLUSH_STRICT: Setting[bool] = Setting(
        False,
        "Re-raise errors of the synchronous flush after commit instead of logging them "
        "and leaving the rows to the drain. Meant for tests.",
    )
    REQUIRE_CONTEXT: Setting[bool] = Setting(
        False, "Refuse to save outbox rows outside any `outbox_context`."
    )
    MAX_PAYLOAD_BYTES: Setting[int] = Setting(
        1_000_000,
        "Largest accepted payload, measured as its JSON encoding in UTF-8; 0: no limit.",
        at_least=0,
    )
    MAX_HEADERS_BYTES: Setting[int] = Setting(
        8192,
        "Largest accepted headers of a message (a dict of str to str), measured as the "
        "UTF-8 bytes of its names and values together; 0: no limit.",
        at_least=0,
    )
    WRITER_HEADERS_ALLOWED: Setting[list[str]] = Setting(
        [],
        "Credential headers a writer may set on a message (`authorization`, "
        "`proxy-authorization`), which are otherwise reserved for the relays; a relay's "
        "own credentials still win. No other reserved name can be allowed.",
        blank=True,
    )
    DEFER_WRITES: Setting[bool] = Setting(
        False,
        "Opt-in: hold the outbox rows saved inside an `outbox_context` that opens the "
        "outermost transaction, and write them with one bulk insert as it commits (on "
        "PostgreSQL with psycopg 3, in the COMMIT's round trip). Until then they have no "
        "primary key and are not visible to queries in the block. Off (the default), every "
        "save INSERTs at once, as `Model.save` does. `outbox_context(defer=...)` overrides "
        "it per block.",
    )
    FAST_PATH: Setting[bool] = Setting(
        True,
        "Use the fast path of PostgreSQL and of MariaDB 10.6+. Off, they take the portable "
        "path like every other database.",
    )
    BACKENDS: Setting[list[str]] = Setting(
        [
            "outbox.backends.postgresql.PostgresBackend",
            "outbox.backends.mariadb.MariaDBBackend",
            "outbox.backends.portable.PortableBackend",
        ],
        "The database backends, as dotted paths to `OutboxBackend` subclasses, tried in "
        "order: the first whose `supports(connection)` accepts a database drains it, and "
        "the portable path drains a database none accepts. With `OUTBOX_FAST_PATH` off, "
        "only subclasses of `PortableBackend` are tried. A backend of your own goes "
        "first (see the how-to 'Write a backend'); `outbox.E022` reports a path that does "
        "not import or is not an `OutboxBackend`.",
    )
    SETTLE_IN_BACKGROUND: Setting[bool] = Setting(
        True,
        "On the fast paths of PostgreSQL and MariaDB: while a drain works through a "
        "backlog, settle the batch it has just delivered (delete its rows, release its "
        "shards) on a thread with a database connection of its own, and claim the next "
        "batch on another, so the database settles and claims while Python delivers. "
        "Off, a drain uses one connection only.",
    )
    LOOP_INTERVAL_SECONDS: Setting[float] = Setting(
        1.0,
        "How long `drain_outboxes --loop` sleeps when nothing is due. On PostgreSQL with "
        "`OUTBOX_NOTIFY` on, a write to one of its tables wakes it sooner; this is then "
        "only the fallback, should a notification be lost.",
        above=0,
    )
    LOOP_GATHER_SECONDS: Setting[float] = Setting(
        0.005,
        "How long a round of `drain_outboxes --loop` waits after a small batch (not full, "
        "fewer than 16 rows) before it claims again, so that commits arriving one at a "
        "time are claimed, read and settled together, at fewer statements a message. The "
        "first message after an idle moment is delivered at once; each later one may wait "
        "up to this long, and a batch of 16 rows or more never waits. 0 claims again at "
        "once; the bench README's trickle section has what each choice costs and saves.",
        at_least=0,
    )
    NOTIFY: Setting[bool] = Setting(
        True,
        "PostgreSQL: wake an idle `drain_outboxes --loop` within milliseconds of a commit. "
        "`migrate` gives every outbox table a statement-level trigger that NOTIFYs at "
        "commit, and the loop LISTENs on a connection of its own. Off, `migrate` removes "
        "the triggers and the loop polls every `OUTBOX_LOOP_INTERVAL_SECONDS`, as on other "
        "databases.",
    )
    GRACEFUL_TIMEOUT_SECONDS: Setting[float] = Setting(
        30.0,
        "After SIGTERM/SIGINT to `drain_outboxes` or a Celery warm shutdown: how long the "
        "receiver in flight may still run. Past it the drain stops anyway and that shard's "
        "lease expires normally.",
        at_least=0,
    )
    PROMPT_DRAIN: Setting[str | None] = Setting(
        None,
        "Dotted path of a callable run after a commit that left outbox rows to the drain "
        "(`flush=False`, or no `outbox_context`), with the database alias and the written "
        "shards per table: `outbox.integrations.celery.prompt_drain` or "
        "`outbox.integrations.django_tasks.prompt_drain` enqueue a drain of those shards.",
        kind=str,
        blank=True,  # "" (e.g. from an unset environment variable) is off, like None
    )
    TASK_SHARDS: Setting[int] = Setting(
        50, "Most shards one drain task (Celery or Django Tasks) is given.", at_least=1
    )
    TASK_SECONDS: Setting[float] = Setting(
        60.0,
        "Time budget of one drain task: past it, the task finishes the receiver in flight, "
        "releases its other shards and returns.",
        above=0,
    )
    CELERY_SCHEDULE_TASK: Setting[str] = Setting(
        "outbox.schedule_drains", "Name of the Celery task that fans due shards out."
    )
    CELERY_DRAIN_TASK: Setting[str] = Setting(
        "outbox.drain", "Name of the Celery task that drains shards."
    )
    CELERY_QUEUE: Setting[str | None] = Setting(
        None,
        "Queue of the outbox Celery tasks; `None` uses Celery's routing (default queue).",
        kind=str,
    )
    CELERY_SCHEDULE_SECONDS: Setting[float] = Setting(
        5.0, "Interval of the beat entry that `add_beat_schedule()` adds.", above=0
    )
    CELERY_MAX_TASKS: Setting[int] = Setting(
        20,
        "Per outbox table, most drain tasks queued or running at once: the scheduler keeps "
        "the shards in flight (live leases) under this times `OUTBOX_TASK_SHARDS`.",
        at_least=1,
    )
    CELERY_TIME_LIMIT_SECONDS: Setting[float] = Setting(
        900.0,
        "Celery hard time limit of a drain task: a worker process stuck past it is killed, "
        "and its shards' leases expire. Longer than `OUTBOX_TASK_SECONDS`.",
        above=0,
    )
    TASKS_BACKEND: Setting[str] = Setting(
        "default", "Django Tasks backend alias of the outbox tasks (a key of `TASKS`)."
    )
    TASKS_QUEUE_NAME: Setting[str] = Setting("default", "Django Tasks queue of the outbox tasks.")
    MAX_ATTEMPTS: Setting[int] = Setting(
        0,
        "Failed attempts after which a message becomes a dead letter, kept for an operator "
        "while its shard goes on; 0 (the default) never gives up, blocking the shard to "
        "keep its order. A category may set its own (see the docs).",
        at_least=0,
    )
    RETRY_POLICY: Setting[str] = Setting(
        "outbox.retry.RetryPolicy",
        "Dotted path of the `outbox.retry.RetryPolicy` subclass that decides how failed "
        "deliveries are retried: each retry's delay, and when a message becomes a dead "
        "letter. The default backs off per `OUTBOX_BACKOFF_BASE_SECONDS` and "
        "`OUTBOX_BACKOFF_MAX_SECONDS` and gives up per `OUTBOX_MAX_ATTEMPTS`. A category "
        "may name its own (`OutboxCategory.retry_policy`).",
    )
    INBOX_RETENTION_SECONDS: Setting[float] = Setting(
        7 * 24 * 3600.0,
        "How long the records of `inbox_receiver`s are kept (a week by default): a "
        "message redelivered after its record was pruned is applied again. The check "
        "`outbox.E019` refuses a retention shorter than a message can be redelivered.",
    )
    METRICS: Setting[str | None] = Setting(
        None,
        "Where metrics go: `prometheus`, `statsd`, `opentelemetry`, or the dotted path of "
        "a metrics class; None (the default) records nothing and costs nothing.",
        kind=str,
    )
    STATSD_HOST: Setting[str] = Setting(
        "127.0.0.1", "StatsD host, with `OUTBOX_METRICS = 'statsd'`."
    )
    STATSD_PORT: Setting[int] = Setting(8125, "StatsD UDP port.", at_least=1)
    STATSD_PREFIX: Setting[str] = Setting("outbox", "Prefix of the StatsD metric names.")
    HEARTBEAT_SECONDS: Setting[float] = Setting(
        60.0,
        "How often `drain_outboxes --loop` logs its one-line heartbeat (rate, backlog, lag) "
        "at INFO.",
        above=0,
    )
    TASK_LIVENESS_FILE: Setting[str | None] = Setting(
        None,
        "Path of a file a Celery or Django Tasks worker touches every few seconds, busy or "
        "idle, unless one of its drains ran past `OUTBOX_TASK_SECONDS` plus "
        "`OUTBOX_GRACEFUL_TIMEOUT_SECONDS` (stuck in a call): for a liveness probe that "
        "checks its age. None (the default): no file.",
        kind=str,
    )
    DRAIN_BEACON_SECONDS: Setting[float] = Setting(
        10.0,
        "How often a long-running drain (`drain_outboxes --loop`, a Celery or Django Tasks "
        "worker process that ran an outbox task) records itself in the drain process table "
        "of each database it drains, from a thread of its own: host, pid, last beat, rows "
        "retired in the last minute, receiver calls running and the longest one; each beat also "
        "adds its rows and the lag it sees to the minute's row, the dashboard's last hour. "
        "`outbox_status` and the admin dashboard list the live drains; a drain that misses "
        "three beats is no longer listed (and, in Prometheus' multiprocess mode, its gauges "
        "are withdrawn). A drain that stops cleanly removes its record at once. 0: no "
        "record (the drains are then not listed).",
        at_least=0,
    )
    METRICS_REFRESH_SECONDS: Setting[float] = Setting(
        30.0,
        "How often a Celery or Django Tasks worker that ran a drain reads the backlog and "
        "health gauges, from a thread of its own (one process per "
        "`PROMETHEUS_MULTIPROC_DIR`); 0 turns that off. `drain_outboxes --loop` reads "
        "them at its heartbeat instead. Only with `OUTBOX_METRICS` set.",
        at_least=0,
    )


SETTINGS: dict[str, Setting[Any]] = {
    name: setting for name, setting in vars(OutboxSettings).items() if isinstance(setting, Setting)
}
"""Every setting by its name without the ``OUTBOX_`` prefix, in declaration order."""

outbox_settings = OutboxSettings()
