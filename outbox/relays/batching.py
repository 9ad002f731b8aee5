"""Calls of one relay made at the same time, from the drain's slot threads (one shard
each), published together: one `publish` and one confirm for many shards.

The first caller to find no publish running publishes what is queued by then, its own
message included; callers arriving meanwhile queue theirs and wait, and the next of them
to find the relay free publishes the lot. So a batch grows with the calls made while
the last one was on the wire, and no call waits for a timer: with one slot (or one call
at a time) it is a publish per message. A shard has one call in flight at a time (the
engine's rule), so a batch holds at most one message per shard and every shard keeps
its order.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outbox.relays.message import Message

Publish = Callable[[Sequence["Message"]], Mapping[uuid.UUID, BaseException]]


class _Call:
    __slots__ = ("done", "failure", "lead", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.failure: BaseException | None = None
        self.lead = False  # woken to publish next, not answered
        self.done = threading.Event()


class Batcher:
    """Joins concurrent calls into batches of at most `max_batch` messages."""

    def __init__(self, publish: Publish, max_batch: int = 1000) -> None:
        self._publish = publish
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queued: list[_Call] = []
        self._publishing = False

    def send(self, message: Message) -> BaseException | None:
        """Publish `message` with whatever else is queued; its failure, or None."""
        call = _Call(message)
        with self._lock:
            self._queued.append(call)
            lead = not self._publishing
            if lead:
                self._publishing = True
        if not lead:
            call.done.wait()
            if not call.lead:
                return call.failure
            call.lead = False
            call.done.clear()
        return self._lead(call)

    def _lead(self, call: _Call) -> BaseException | None:
        """Publish batches until the queue is empty or `call` is answered; then hand the
        relay to the next caller still waiting, if any."""
        while not call.done.is_set():
            with self._lock:
                batch, self._queued = (
                    self._queued[: self.max_batch],
                    self._queued[self.max_batch :],
                )
            self._answer(batch)
        with self._lock:
            if self._queued:
                successor = self._queued[0]
                successor.lead = True
                successor.done.set()
            else:
                self._publishing = False
        return call.failure

    def _answer(self, batch: list[_Call]) -> None:
        try:
            failures = self._publish([queued.message for queued in batch])
        except Exception as error:  # the whole batch failed (a lost connection)
            failures = {queued.message.message_id: error for queued in batch}
        for queued in batch:
            queued.failure = failures.get(queued.message.message_id)
            queued.done.set()
