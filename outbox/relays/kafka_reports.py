"""One batch's delivery reports, and what failed by message: KafkaRelay produces a
whole batch before any report comes back, so the per-shard rule of `Relay.publish` is
applied to the reports (a shard's messages after its first failure count as failed,
whatever their own report said)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from outbox.exceptions import PermanentFailure
from outbox.relays.base import Message, failed_in_shard_order

if TYPE_CHECKING:
    from confluent_kafka import KafkaError

__all__ = ["Reports", "as_failure", "failures_by_shard", "is_fatal", "produce_in_turn"]


class Reports:
    """One batch's delivery reports, filled in by whichever thread serves them."""

    def __init__(self) -> None:
        self.errors: dict[uuid.UUID, BaseException | None] = {}
        self.pending = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.done.set()

    def expect(self, message_id: uuid.UUID) -> Callable[[KafkaError | None, Any], None]:
        """The delivery callback of one record."""
        with self.lock:
            self.pending += 1
            self.done.clear()

        def report(error: KafkaError | None, record: Any) -> None:
            outcome = None if error is None else as_failure(error)
            with self.lock:
                self.errors[message_id] = outcome
                self._settle()

        return report

    def cancel(self) -> None:
        """A record the producer refused: no report will come for it."""
        with self.lock:
            self._settle()

    def _settle(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.done.set()

    def outcome(self, message_id: uuid.UUID, timeout: float) -> BaseException | None:
        with self.lock:
            if message_id in self.errors:
                return self.errors[message_id]
        return TimeoutError(
            f"Kafka sent no delivery report within {timeout:g}s (are the brokers reachable, "
            f"does the topic exist?)"
        )


def produce_in_turn(
    messages: Sequence[Message], produce: Callable[[Message], None]
) -> dict[uuid.UUID, BaseException]:
    """Produce each message in turn; a shard's messages after one the producer refused
    are not produced."""
    refused: dict[uuid.UUID, BaseException] = {}
    broken: set[str] = set()
    for message in messages:
        if message.shard_key in broken:
            continue
        try:
            produce(message)
        except Exception as error:
            refused[message.message_id] = error
            broken.add(message.shard_key)
    return refused


def failures_by_shard(
    messages: Sequence[Message],
    refused: Mapping[uuid.UUID, BaseException],
    reports: Reports,
    timeout: float,
) -> dict[uuid.UUID, BaseException]:
    """What failed, by message id: each message's own failure, and after a shard's first
    failure every later message of that shard (delivered or not), so the shard is
    retried from there in order."""
    return failed_in_shard_order(
        messages,
        lambda message: (
            refused.get(message.message_id) or reports.outcome(message.message_id, timeout)
        ),
    )


def as_failure(error: Any) -> BaseException:
    """What a Kafka error (a KafkaError, or an exception raised by produce) counts as:
    a record too large for the producer or the broker can never be published."""
    from confluent_kafka import KafkaError, KafkaException

    kafka_error = error if isinstance(error, KafkaError) else None
    if isinstance(error, KafkaException) and isinstance(error.args[0], KafkaError):
        kafka_error = error.args[0]
    if kafka_error is None:
        return error if isinstance(error, BaseException) else RuntimeError(str(error))
    if kafka_error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return PermanentFailure(f"Kafka refused the record: {kafka_error.str()}")
    return error if isinstance(error, KafkaException) else KafkaException(kafka_error)


def is_fatal(error: BaseException) -> bool:
    """A fatal error: the idempotent producer cannot go on and must be made again."""
    kafka_error = error.args[0] if error.args else None
    return bool(getattr(kafka_error, "fatal", lambda: False)())
