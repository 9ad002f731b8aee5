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
    "FAST_PATH": Setting(
        True,
        "Use the PostgreSQL fast path on PostgreSQL. Off, PostgreSQL takes the portable "
        "path like every other database.",
    ),
    "LOOP_INTERVAL_SECONDS": Setting(
        1.0, "How long `drain_outboxes --loop` sleeps when nothing is due."
    ),
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
