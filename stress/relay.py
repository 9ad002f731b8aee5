"""The relay of the relay leg: an `AmqpRelay` connected to both stress categories, before
the journaling and inbox receivers, in every process that delivers (drainers, and the
writers' synchronous flushes), publishing through the runner's proxy.

Connected first, so the journaling receiver, called next on the same thread, knows
whether the publish failed (`stress/handoff.py`) and then journals a
failed call and raises: the journal then says what the engine did with the group (a
failed delivery, retried with every receiver not done), and the checker's lost, order
and duplicate rules hold for the relay as they do for the receivers. A receiver that
hangs (the `hang` fault) does so after the publish, not before it.

It records each publish's outcome in STRESS_TMP/relay-<pid>.jsonl, one line per batch
(time, process, the message ids the broker confirmed and those reported failed with
their error), so the checker can tell a message the broker confirmed but the queue
lacks (lost by the relay) from one reported failed that arrived all the same (a
confirm lost in a cut: a repeat follows).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outbox.relays.amqp import AmqpRelay
from outbox.relays.base import Failures, Message
from stress import handoff
from stress.outboxes import StressScope
from stress.receivers import PROCESS

NAME = "stress-amqp"


class RecordingAmqpRelay(AmqpRelay):
    """`AmqpRelay` that writes down what each publish reported."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record = Path(os.environ["STRESS_TMP"]) / f"relay-{os.getpid()}.jsonl"
        self._write = threading.Lock()

    def __call__(self, signal: Any = None, sender: Any = None, **kwargs: Any) -> None:
        try:
            super().__call__(signal, sender, **kwargs)
        except Exception:
            handoff.publish_failed(kwargs.get("message_id"))  # for the journal, next
            raise

    def publish(self, messages: Sequence[Message]) -> Failures:
        failed = super().publish(messages)
        line = {
            "at": time.time(),
            "process": PROCESS,
            "ok": [str(m.message_id) for m in messages if m.message_id not in failed],
            "failed": {str(k): f"{type(v).__name__}: {v}"[:200] for k, v in failed.items()},
        }
        with self._write, self.record.open("a") as out:
            out.write(json.dumps(line) + "\n")
        return failed


def connect() -> None:
    """Connect the relay (the runner asked for it: STRESS_RELAY=amqp)."""
    RecordingAmqpRelay(
        NAME,
        url=os.environ["STRESS_AMQP_URL"],
        exchange=os.environ["STRESS_AMQP_EXCHANGE"],
        declare=False,  # the runner declared it, with the queue bound
        mandatory=True,  # a message the queue did not take is a failure, not a drop
        connect_timeout=2.0,
        confirm_timeout=2.0,  # below the stress receiver deadline (3 s)
    ).connect(StressScope.STRESS)


def outcomes(tmp: Path) -> tuple[dict[str, float], Counter[str], dict[str, str]]:
    """From a run's records: message id -> when the broker first confirmed it, how many
    times it confirmed it, and the first failure reported for it."""
    first: dict[str, float] = {}
    confirms: Counter[str] = Counter()
    failed: dict[str, str] = {}
    for path in sorted(tmp.glob("relay-*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:  # a line cut short by kill -9
                continue
            for message_id in line["ok"]:
                first[message_id] = min(first.get(message_id, line["at"]), line["at"])
                confirms[message_id] += 1
            for message_id, error in line["failed"].items():
                failed.setdefault(message_id, error)
    return first, confirms, failed
