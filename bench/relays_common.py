"""What the relays section (`bench.relays`) shares across its relays: the shape of the
messages, a relay that counts its publishes, the timed drain, the hand-built messages of
the raw floors and the check of what a consumer read back.

Row `g` of a run goes to shard `g % shards + 1`, round `g // shards`, object
`(g % shards) * rounds + g // shards + 1` (`bench.db.load_shape`): one message per shard
per round, every message its own object (nothing coalesces), and a shard's objects grow
with its rounds, so a consumer sees a shard in order exactly when the object
identifiers it reads for that shard increase.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bench.outboxes import BenchCategory, BenchScope
from bench.shapes import Shape
from outbox.relays import Message, Relay

CATEGORY = BenchCategory.RELAY_PUBLISH
SCOPE = BenchScope.RELAY
WARM_UP_SHARD = 0  # the shard of the one message each publisher sends before it is timed


def shape(shards: int, rounds: int) -> Shape:
    """The run's rows (`bench.db.load_shape` writes them): `rounds` distinct objects per
    shard, one message each."""
    return Shape("relays", "relays", SCOPE, CATEGORY, shards, rounds, 1)


def shard_key(shard: int) -> str:
    """The shard as the relays send it (`Message.shard_key`)."""
    return f"{SCOPE.name}:{shard}"


class Counting(Relay):
    """Mixed in before a relay class: notes the size of every batch it publishes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def publish(self, messages: Sequence[Message]) -> Any:
        self.batches.append(len(messages))
        return super().publish(messages)


def warm_up_message() -> Message:
    """A message outside the run's shards: published once before the timing starts, so
    connections and producers are made beforehand."""
    return Message(
        message_id=uuid.uuid4(),
        category=CATEGORY,
        scope=SCOPE,
        shard_identifier=WARM_UP_SHARD,
        object_identifier=0,
        payload={"object": 0, "version": 0, "name": "warm-up"},
    )


@dataclass(frozen=True)
class Drained:
    seconds: float
    complete: bool
    failures: int
    receiver_calls: int


def drain_to_empty(concurrency: int, slots: Any, budget: float) -> Drained:
    """One-shot drains of RegionOutbox on the kept slot threads until it is empty (or
    `budget` passed), timed from the first drain's start to the last one's end."""
    from bench.db import outbox_rows
    from outbox.engine import drain_outboxes
    from outbox.models import RegionOutbox

    deadline = time.monotonic() + budget
    failures = calls = 0
    started = finished = time.perf_counter()
    while True:
        stats = drain_outboxes(
            [RegionOutbox], concurrency=concurrency, slots=slots, deadline=deadline
        )
        finished = time.perf_counter()
        failures, calls = failures + stats.failures, calls + stats.receiver_calls
        if outbox_rows() == 0:
            return Drained(finished - started, True, failures, calls)
        if time.monotonic() >= deadline:
            return Drained(finished - started, False, failures, calls)
        if not stats.receiver_calls:
            time.sleep(0.05)  # what is left is backing off after a failure


def engine_alone(shards: int, rounds: int, concurrency: int, budget: float) -> float:
    """The same rows drained the same way to a receiver that returns at once instead
    of the relay: what the engine alone costs them. Messages per second."""
    from bench.db import load_shape, reset
    from outbox.engine.slots import kept_slots
    from outbox.signals import process_region_outbox

    def no_op(sender: Any, **kwargs: Any) -> None:
        pass

    reset()
    rows = load_shape(shape(shards, rounds))
    process_region_outbox.connect(no_op, sender=CATEGORY, weak=False)
    try:
        with kept_slots(concurrency) as slots:
            drained = drain_to_empty(concurrency, slots, budget)
    finally:
        process_region_outbox.disconnect(no_op, sender=CATEGORY)
    return rows / drained.seconds if drained.complete else 0.0


# -- the raw floors' messages -----------------------------------------------------------


@dataclass(frozen=True)
class RawMessage:
    """One message of a raw floor, as its hand loop gets it: no body or headers yet."""

    shard: int
    obj: int

    @property
    def key(self) -> str:
        return shard_key(self.shard)


def raw_messages(shards: int, rounds: int) -> list[RawMessage]:
    """The run's messages in id order, the same as the loaded rows."""
    return [RawMessage(g % shards + 1, _object(g, shards, rounds)) for g in range(shards * rounds)]


def _object(g: int, shards: int, rounds: int) -> int:
    """The object of row `g`, as `bench.db.load_shape` writes it."""
    return (g % shards) * rounds + g // shards + 1


def batches(messages: list[RawMessage], size: int) -> Iterator[list[RawMessage]]:
    size = max(size, 1)
    for start in range(0, len(messages), size):
        yield messages[start : start + size]


def cloudevent(message: RawMessage) -> tuple[str, bytes, dict[str, str]]:
    """A raw floor's message: its id, the structured CloudEvents JSON body the relays
    send (the same attributes and data) and the relays' own headers. Built inside the
    timed loop, as a producer of its own would build it."""
    message_id = str(uuid.uuid4())
    body = {
        "specversion": "1.0",
        "id": message_id,
        "source": f"/outbox/{SCOPE.name.lower()}",
        "type": CATEGORY.name.lower(),
        "subject": str(message.obj),
        "time": datetime.now(timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        "data": {"object": message.obj, "version": 0, "name": f"o{message.obj}"},
    }
    headers = {
        "outbox-message-id": message_id,
        "outbox-category": CATEGORY.name,
        "outbox-shard": message.key,
        "outbox-attempt": "1",
    }
    return message_id, json.dumps(body, separators=(",", ":")).encode(), headers


def subject(body: bytes | str) -> int:
    """The object identifier of a structured CloudEvents body read back."""
    return int(json.loads(body)["subject"])


# -- what the consumer read -------------------------------------------------------------


def tally(read: list[tuple[str, int]], shards: int, rounds: int) -> dict[str, Any]:
    """Lost, duplicate and unexpected messages, and the shards whose messages were read
    out of order, from (shard key, object) pairs in the order a consumer read them (the
    warm-up message left out)."""
    warm_up = shard_key(WARM_UP_SHARD)
    read = [pair for pair in read if pair[0] != warm_up]
    expected = {(m.key, m.obj) for m in raw_messages(shards, rounds)}
    seen: set[tuple[str, int]] = set()
    by_shard: dict[str, list[int]] = defaultdict(list)
    duplicates = 0
    for pair in read:
        if pair in seen:
            duplicates += 1
            continue
        seen.add(pair)
        by_shard[pair[0]].append(pair[1])
    return {
        "read": len(read),
        "lost": len(expected - seen),
        "duplicates": duplicates,
        "unexpected": len(seen - expected),
        "order_violations": sum(1 for objs in by_shard.values() if objs != sorted(objs)),
    }
