"""Cursors the app keeps per Django connection, on that connection's driver connection,
for statements it runs over and over: made on first use and made again after a
reconnect. Each is handed out inside Django's own cursor wrapper, so query logging,
`CaptureQueriesContext` and execute wrappers see its statements as any other."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

# Per Django connection and purpose, the driver connection a cursor was made on and the
# cursor. Keyed by Django's wrapper, not the driver connection: the cursor refers to the
# driver connection, and a weak key its own value keeps alive would never be dropped.
_kept: WeakKeyDictionary[BaseDatabaseWrapper, dict[str, tuple[Any, Any]]] = WeakKeyDictionary()


def kept_cursor(connection: BaseDatabaseWrapper, purpose: str, make: Callable[[Any], Any]) -> Any:
    """The cursor kept for `purpose` on the connection's driver connection, wrapped as
    Django wraps its own; `make(driver_connection)` makes it the first time, and after
    a reconnect or once it is closed. Not to be closed by the caller (no `with`)."""
    connection.ensure_connection()
    driver = connection.connection
    kept = _kept.get(connection)
    if kept is None:
        kept = _kept[connection] = {}
    driver_then, cursor = kept.get(purpose, (None, None))
    if driver_then is not driver or cursor.closed:
        cursor = make(driver)
        kept[purpose] = (driver, cursor)
    if connection.queries_logged:
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)


class CommitWithInsert(Protocol):
    """A database's way to send the deferred writer's COMMIT in the same round trip as
    its last INSERT (`OutboxBackend.commit_with_last_insert`): an execute wrapper for
    that INSERT, and the driver cursor the INSERT runs on (made by `cursor(driver)`,
    kept by `kept_cursor`), so that what the driver needs stays with the database."""

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any: ...

    def cursor(self, driver: Any) -> Any: ...
