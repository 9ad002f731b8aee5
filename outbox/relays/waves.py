"""A batch published in waves, for relays whose client sends many messages before it
learns which of them failed (AMQP publisher confirms, a Redis pipeline).

Wave n holds the n-th message of every shard in the batch, so a wave never carries two
messages of one shard: when one fails, no later message of its shard has been sent yet
and none is (they are reported failed with the same error), and a wave sent again after
a lost connection repeats at most one message per shard, which keeps each shard's
order at the consumer once repeats are dropped. A batch of one message per shard, the
usual case, is one wave: one round trip, one confirm.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

from outbox.relays.base import Message, held_back

__all__ = ["in_waves", "publish_in_waves"]

SendWave = Callable[[list[Message]], Mapping[uuid.UUID, BaseException]]


def in_waves(messages: Sequence[Message]) -> list[list[Message]]:
    """The first message of every shard, then the second, and so on; each wave keeps
    the order the shards first appear in."""
    waves: list[list[Message]] = []
    seen: dict[str, int] = {}
    for message in messages:
        position = seen.get(message.shard_key, 0)
        seen[message.shard_key] = position + 1
        if position == len(waves):
            waves.append([])
        waves[position].append(message)
    return waves


def publish_in_waves(messages: Sequence[Message], send: SendWave) -> dict[uuid.UUID, BaseException]:
    """Send each wave with `send`, which returns the failures by message id, and skip
    the later messages of a shard that failed (reported with its error). An exception
    out of `send` (a lost connection) fails that wave and every later one with it: the
    relay reconnects on its next call."""
    failed: dict[uuid.UUID, BaseException] = {}
    broken: dict[str, BaseException] = {}
    lost: BaseException | None = None
    for wave in in_waves(messages):
        ready = []
        for message in wave:
            earlier = lost or broken.get(message.shard_key)
            if earlier is not None:
                failed[message.message_id] = held_back(earlier, message)
            else:
                ready.append(message)
        if not ready:
            continue
        try:
            wave_failures = send(ready)
        except Exception as error:
            lost = error
            wave_failures = {message.message_id: error for message in ready}
        for message in ready:
            failure = wave_failures.get(message.message_id)
            if failure is not None:
                failed[message.message_id] = failure
                broken[message.shard_key] = failure
    return failed
