"""CeleryTaskRelay: each message sent as a call of a named Celery task.

Client: Celery, the extra ``django-outboxes[celery]``. The task is named, not imported,
so it may live in another code base; it is called with the message as keyword arguments
(`task_kwargs`), its task id is the message id (the same on every retry of the message,
so a task can tell a repeat), and the relay headers travel as the task message's headers
(``self.request.headers`` in a bound task). A message counts as delivered once the
broker took it: with RabbitMQ, turn on publisher confirms
(``broker_transport_options = {"confirm_publish": True}``) for that to mean stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.core.checks import CheckMessage

from outbox.relays.base import Failures, Message, Relay, client_library, skip_after_failure

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["CeleryTaskRelay", "task_kwargs"]

# The send_task arguments the relay sets for each message.
_SET_BY_THE_RELAY = ("kwargs", "task_id", "headers", "producer", "add_to_parent")


class CeleryTaskRelay(Relay):
    """Send the task named `task` for each message.

    `app`: the Celery app to send with (default: the current app, looked up at each
    publish). `queue`: the queue to send to (default: Celery's routing). `options`:
    more options of ``send_task`` (``priority``, ``expires``, ``retry_policy``...).
    """

    extra = "celery"

    def __init__(
        self,
        name: str,
        *,
        task: str,
        app: Celery | None = None,
        queue: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, envelope="bare")
        self._celery = client_library("celery", "CeleryTaskRelay", "Celery", "celery")
        self.task = task
        self.app = app
        self.queue = queue
        self.options = dict(options or {})

    def publish(self, messages: Sequence[Message]) -> Failures:
        if not messages:
            return {}
        app = self.app if self.app is not None else self._celery.current_app
        # One producer (one broker connection) for the whole batch.
        with app.producer_or_acquire() as producer:
            return skip_after_failure(messages, lambda message: self._send(app, producer, message))

    def _send(self, app: Celery, producer: Any, message: Message) -> None:
        options: dict[str, Any] = {"queue": self.queue} if self.queue else {}
        options.update(self.options)
        app.send_task(
            self.task,
            kwargs=task_kwargs(message),
            task_id=str(message.message_id),
            headers=message.relay_headers(),
            producer=producer,
            # The relay may run inside a task (a drain): the sent task is not its child.
            add_to_parent=False,
            **options,
        )

    def check(self) -> list[CheckMessage]:
        errors = []
        if not (isinstance(self.task, str) and self.task):
            errors.append(f"task must be a task's name (a non-empty str), not {self.task!r}")
        if self.queue is not None and not (isinstance(self.queue, str) and self.queue):
            errors.append(f"queue must be a queue's name or None, not {self.queue!r}")
        taken = sorted(set(self.options) & set(_SET_BY_THE_RELAY))
        if taken:
            errors.append(f"options may not set {taken}: the relay sets them per message")
        return [self.error(text) for text in errors]


def task_kwargs(message: Message) -> dict[str, Any]:
    """The keyword arguments the task is called with: plain JSON values."""
    return {
        "message_id": str(message.message_id),
        "category": message.category.name,
        "shard_scope": message.scope.name,
        "shard_identifier": message.shard_identifier,
        "region_name": message.region_name,
        "object_identifier": message.object_identifier,
        "payload": message.payload,
        "attempt": message.attempt,
        "headers": dict(message.headers),
        "time": message.time.isoformat(),
    }
