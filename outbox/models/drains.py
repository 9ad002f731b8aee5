"""The drain processes: each long-running drain records itself here while it runs.

A drain process (`drain_outboxes --loop`, a Celery or Django Tasks worker process that
ran an outbox task) beats every `OUTBOX_DRAIN_BEACON_SECONDS` into one row of
`OutboxDrainProcess` per database it drains (`outbox.health.beacon.DrainBeacon`): who it
is (host, pid, kind), since when, and what it is doing (rows retired in the last minute,
receiver calls running and the longest of them). Each beat moves the row's expiry
`BEATS_TO_EXPIRY` beats ahead on the database clock, so a process that stops beating
(killed, frozen, its host gone) is no longer alive once that passes, whatever the
reader's own settings; any beat deletes the rows past their expiry, and a drain that
stops cleanly deletes its own at once.

The same beats keep the last hour of activity per database, a row of `OutboxDrainMinute`
per minute (`record_minute`): the rows the drains retired in that minute (each beat adds
its process's rows since its last beat) and the lag the beats saw (the age of the oldest
due message of the database's outbox tables, the highest sampled in that minute). The
admin dashboard draws them; rows older than `KEPT_MINUTES` are deleted by the beats.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, models
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from django.db.models.functions import Greatest, Now

if TYPE_CHECKING:
    from typing_extensions import Self

# A drain is alive until it has missed this many beats.
BEATS_TO_EXPIRY = 3

# Minutes of activity kept (`OutboxDrainMinute`): the dashboard's hour and a margin.
KEPT_MINUTES = 90

# What runs the drain, as `kind` records it.
LOOP, CELERY, DJANGO_TASKS = "loop", "celery", "django-tasks"


class OutboxDrainProcessQuerySet(models.QuerySet[Any]):
    """The drain states, on the database clock: alive (its expiry not passed) or
    expired (it stopped beating)."""

    def alive(self) -> Self:
        return cast("Self", self.filter(expires_at__gt=Now()))

    def expired(self) -> Self:
        return cast("Self", self.filter(expires_at__lte=Now()))

    def named(self, name: str) -> Self:
        return cast("Self", self.filter(name=name))


class OutboxDrainProcess(models.Model):
    """One live (or lately dead) drain process, as its last beat described it."""

    name = models.CharField(max_length=128, unique=True, help_text="host:pid")
    host = models.CharField(max_length=100)
    pid = models.IntegerField()
    kind = models.CharField(max_length=20, help_text="loop, celery or django-tasks")
    started_at = models.DateTimeField(db_default=Now())
    beat_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()
    rows_last_minute = models.IntegerField(default=0)
    calls_running = models.IntegerField(default=0)
    # Calls given up at OUTBOX_RECEIVER_TIMEOUT_SECONDS whose threads still run.
    stuck_calls = models.IntegerField(default=0)
    longest_call_seconds = models.FloatField(null=True, blank=True)
    longest_call = models.CharField(max_length=255, blank=True, default="")

    objects = OutboxDrainProcessQuerySet.as_manager()

    class Meta:
        verbose_name = "outbox drain process"

    def __str__(self) -> str:
        return f"{self.kind} drain {self.name}"


def expiry_after(seconds: float) -> ExpressionWrapper[Any]:
    """The database clock plus `seconds`."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def record_beat(using: str, name: str, *, expires_in: float, **fields: Any) -> None:
    """Upsert the row of drain `name` on database `using`: beaten now, alive for
    `expires_in` seconds more, with `fields` (host, pid, kind, what it does). Rows past
    their expiry are deleted first. Each statement commits on its own."""
    drains = OutboxDrainProcess.objects.using(using)
    drains.expired().delete()
    state = {key: value for key, value in fields.items() if key not in ("host", "pid", "kind")}
    expires_at = expiry_after(expires_in)
    if not drains.named(name).update(beat_at=Now(), expires_at=expires_at, **state):
        drains.create(name=name, expires_at=expires_at, **fields)


def forget(using: str, name: str) -> int:
    """Delete the row of drain `name` on database `using` (it stops); how many."""
    deleted: int = OutboxDrainProcess.objects.using(using).named(name).delete()[0]
    return deleted


class OutboxDrainMinute(models.Model):
    """One minute of the drains' activity on this database (see the module doc)."""

    minute = models.DateTimeField(unique=True, help_text="Start of the minute (UTC).")
    rows_retired = models.BigIntegerField(default=0)
    lag_seconds = models.FloatField(default=0.0, help_text="Highest oldest-due age sampled.")

    class Meta:
        verbose_name = "outbox drain minute"

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M}: {self.rows_retired} rows retired"


def record_minute(using: str, minute: datetime, rows: int, lag_seconds: float) -> None:
    """Add `rows` to `minute`'s row on `using` and raise its lag to `lag_seconds`;
    beats of several drains meet in one row. Each statement commits on its own."""
    minutes = OutboxDrainMinute.objects.using(using)
    change = {
        "rows_retired": F("rows_retired") + rows,
        "lag_seconds": Greatest("lag_seconds", Value(lag_seconds)),
    }
    if minutes.filter(minute=minute).update(**change):
        return
    try:
        minutes.create(minute=minute, rows_retired=rows, lag_seconds=lag_seconds)
    except IntegrityError:  # another drain's beat created it meanwhile
        minutes.filter(minute=minute).update(**change)
    minutes.filter(minute__lt=minute - timedelta(minutes=KEPT_MINUTES)).delete()


def recent_minutes(using: str, since: datetime) -> dict[datetime, tuple[int, float]]:
    """The recorded minutes from `since` on: minute -> (rows retired, lag seconds)."""
    found = OutboxDrainMinute.objects.using(using).filter(minute__gte=since)
    return {
        row["minute"]: (row["rows_retired"], row["lag_seconds"])
        for row in found.values("minute", "rows_retired", "lag_seconds")
    }
