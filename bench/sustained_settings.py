"""Settings of the sustained section's `drain_outboxes --loop` process: the bench
settings, plus the probe that notes when each message's receiver starts
(`bench.sustained_probe`) and a name for its connection in `pg_stat_activity`.

OUTBOX_BENCH_LOOP_INTERVAL, when set, overrides OUTBOX_LOOP_INTERVAL_SECONDS, and
OUTBOX_BENCH_LOOP_GATHER OUTBOX_LOOP_GATHER_SECONDS.
"""

from __future__ import annotations

import os
from typing import Any

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES, INSTALLED_APPS
from bench.sustained_monitor import DRAIN_APPLICATION

INSTALLED_APPS = [*INSTALLED_APPS, "bench.sustained_probe.SustainedProbeConfig"]

_default: dict[str, Any] = dict(DATABASES["default"])
_default["OPTIONS"] = {**_default["OPTIONS"], "application_name": DRAIN_APPLICATION}
DATABASES = {**DATABASES, "default": _default}

if os.environ.get("OUTBOX_BENCH_LOOP_INTERVAL"):
    OUTBOX_LOOP_INTERVAL_SECONDS = float(os.environ["OUTBOX_BENCH_LOOP_INTERVAL"])
if os.environ.get("OUTBOX_BENCH_LOOP_GATHER"):
    OUTBOX_LOOP_GATHER_SECONDS = float(os.environ["OUTBOX_BENCH_LOOP_GATHER"])
