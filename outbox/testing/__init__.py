"""Helpers for testing code that writes outbox messages, with unittest or pytest.

- `capture_outbox_messages()`: record the messages saved in a block, and assert on them.
- `eager_delivery()`: deliver synchronous flushes run early
  (`TestCase.captureOnCommitCallbacks(execute=True)`) inside any open transaction, one
  the test opened itself too, instead of refusing; within TestCase's own transaction
  they deliver without it.
- `deliver_pending()`: deliver the rows left to the drain, now, in the test.
- `OutboxTestMixin`: both, for `django.test.TestCase`.
- The pytest plugin `outbox.testing.pytest_plugin`: fixtures `outbox_messages` and
  `outbox_eager`.

Nothing in the app imports this package. Its names are imported on first use: pytest
loads the plugin (a submodule) before Django is set up, when the models cannot be.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.engine.eager import deliver_eagerly
    from outbox.testing.capture import (
        CapturedMessage,
        CapturedMessages,
        capture_outbox_messages,
    )
    from outbox.testing.eager import deliver_pending, eager_delivery
    from outbox.testing.mixins import OutboxTestMixin

__all__ = [
    "CapturedMessage",
    "CapturedMessages",
    "OutboxTestMixin",
    "capture_outbox_messages",
    "deliver_eagerly",
    "deliver_pending",
    "eager_delivery",
]

_HOMES = {
    "CapturedMessage": "capture",
    "CapturedMessages": "capture",
    "capture_outbox_messages": "capture",
    "deliver_eagerly": "eager",
    "deliver_pending": "eager",
    "eager_delivery": "eager",
    "OutboxTestMixin": "mixins",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'outbox.testing' has no attribute {name!r}")
    return getattr(import_module(f"outbox.testing.{_HOMES[name]}"), name)
