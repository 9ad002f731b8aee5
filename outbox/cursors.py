"""What a database's COMMIT sent with the deferred writer's last INSERT looks like to the
write path (`CommitWithInsert`). The cursors the app keeps per connection for the
statements it runs over and over are made in `outbox.internals` (`kept_cursor`): they
live inside Django's own cursor wrappers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class CommitWithInsert(Protocol):
    """A database's way to send the deferred writer's COMMIT in the same round trip as
    its last INSERT (`OutboxBackend.commit_with_last_insert`): an execute wrapper for
    that INSERT, and the driver cursor the INSERT runs on (made by `cursor(driver)`,
    kept by `kept_cursor`), so that what the driver needs stays with the database."""

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any: ...

    def cursor(self, driver: Any) -> Any: ...
