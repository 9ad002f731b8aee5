"""The app's settings: every ``OUTBOX_*`` setting, its type, its default and its meaning.

Values are read from ``django.conf.settings`` on every access, so ``override_settings``
works, and checked on every access against the setting's type and range: a bad value
raises `OutboxConfigurationError` naming the setting, instead of failing somewhere
deeper later. The system checks (`outbox.checks_settings`) report the same problems
at startup.
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar, cast, overload

from django.conf import settings as django_settings

from outbox.exceptions import OutboxConfigurationError

T = TypeVar("T")

PREFIX = "OUTBOX_"

_KIND_NAMES = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}


class Setting(Generic[T]):
    """One ``OUTBOX_*`` setting: a descriptor on `OutboxSettings` returning its value.

    `kind` is the Python type of the value (`bool`, `int`, `float` or `str`; taken from
    the default unless the default is None, which also allows None). `above` and
    `at_least` bound numbers; strings must not be empty unless `blank`.
    """

    name: str

    def __init__(
        self,
        default: T,
        doc: str,
        *,
        kind: type | None = None,
        above: float | None = None,
        at_least: float | None = None,
        blank: bool = False,
    ) -> None:
        self.default = default
        self.doc = doc
        self.nullable = default is None
        self.kind: type = kind or type(default)
        if self.kind not in _KIND_NAMES:
            raise TypeError(f"unsupported setting kind {self.kind!r}")
        self.above = above
        self.at_least = at_least
        self.blank = blank

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @property
    def setting_name(self) -> str:
        """The name in Django's settings, e.g. ``OUTBOX_LEASE_SECONDS``."""
        return PREFIX + self.name

    @property
    def expected(self) -> str:
        """The values this setting takes, in words ("a number above 0")."""
        words = _KIND_NAMES[self.kind]
        if self.above is not None:
            words += f" above {self.above:g}"
        if self.at_least is not None:
            words += f" of at least {self.at_least:g}"
        if self.kind is str and not self.blank:
            words = "a non-empty string"
        return words + (", or None" if self.nullable else "")

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Setting[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Setting[T] | T:
        if instance is None:
            return self
        value = self.configured()
        problem = self.problem(value)
        if problem:
            raise OutboxConfigurationError(f"{self.setting_name} {problem}.")
        if self.kind is float and value is not None:
            value = float(value)  # an int is fine where a float is expected
        return cast(T, value)

    def configured(self) -> Any:
        """The value as set in Django's settings, or the default; not checked."""
        return getattr(django_settings, self.setting_name, self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this setting, or None if nothing is."""
        return self.type_problem(value) or self.value_problem(value)

    def type_problem(self, value: Any) -> str | None:
        """Why `value` has the wrong type for this setting, or None if it has not."""
        if value is None and self.nullable:
            return None
        if isinstance(value, bool):  # bool is an int subclass: True is no count
            fits = self.kind is bool
        elif self.kind is float:
            fits = isinstance(value, (int, float))
        else:
            fits = isinstance(value, self.kind)
        if fits:
            return None
        return f"is {value!r} ({type(value).__name__}); it must be {self.expected}"

    def value_problem(self, value: Any) -> str | None:
        """Why a value of the right type is out of range, or None if it is not."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, str):
            return None if value or self.blank else f"is empty; it must be {self.expected}"
        out_of_range = (
            (isinstance(value, float) and not math.isfinite(value))
            or (self.above is not None and not value > self.above)
            or (self.at_least is not None and not value >= self.at_least)
        )
        return f"is {value!r}; it must be {self.expected}" if out_of_range else None


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
    BATCH_SHARDS: Setting[int] = Setting(
        100,
        "How many due shards one worker claims at once. On PostgreSQL's fast path a drain "
        "whose shards hold only a row or two each claims more, up to `OUTBOX_BATCH_ROWS` "
        "shards per batch, so one message per shard costs the same round trips per message.",
        at_least=1,
    )
    BATCH_ROWS: Setting[int] = Setting(
        2000,
        "How many rows one read of the claimed shards fetches (coalescing window).",
        at_least=1,
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
    LOOP_INTERVAL_SECONDS: Setting[float] = Setting(
        1.0,
        "How long `drain_outboxes --loop` sleeps when nothing is due. On PostgreSQL with "
        "`OUTBOX_NOTIFY` on, a write to one of its tables wakes it sooner; this is then "
        "only the fallback, should a notification be lost.",
        above=0,
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


SETTINGS: dict[str, Setting[Any]] = {
    name: setting for name, setting in vars(OutboxSettings).items() if isinstance(setting, Setting)
}
"""Every setting by its name without the ``OUTBOX_`` prefix, in declaration order."""

outbox_settings = OutboxSettings()
