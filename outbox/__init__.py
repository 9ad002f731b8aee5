"""Sharded, coalescing transactional outboxes for Django."""

from importlib.metadata import PackageNotFoundError, version

from outbox.categories import OutboxCategory, OutboxScope, unique_object_identifier
from outbox.exceptions import PermanentFailure, RetryLater
from outbox.inbox import inbox_receiver
from outbox.retry import RetryPolicy
from outbox.signals import transactional_receiver
from outbox.writes.context import outbox_context

try:
    __version__ = version("django-outboxes")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "OutboxCategory",
    "OutboxScope",
    "PermanentFailure",
    "RetryLater",
    "RetryPolicy",
    "__version__",
    "inbox_receiver",
    "outbox_context",
    "transactional_receiver",
    "unique_object_identifier",
]
