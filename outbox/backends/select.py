"""The one place that picks a backend for a database.

The backends of `OUTBOX_BACKENDS` are tried in order; the first that supports the
connection (its vendor and version) wins. By default: PostgreSQL, MariaDB 10.6 or
later, then the portable ORM path, which is correct on SQLite, PostgreSQL and
MariaDB/MySQL alike and takes every other database (SQLite, MySQL, MariaDB before
10.6). With OUTBOX_FAST_PATH off only the portable path and its subclasses are tried.

What a database can do beyond draining (the write path's COMMIT with its last INSERT,
waking idle drain loops, its set-up after `migrate`) is asked of the first backend that
supports it whatever OUTBOX_FAST_PATH says: that setting chooses how to drain, not what
the database offers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import connections, router
from django.utils.module_loading import import_string

from outbox.backends.base import OutboxBackend
from outbox.backends.listener import WakeListener
from outbox.backends.portable import PortableBackend
from outbox.conf import outbox_settings
from outbox.cursors import CommitWithInsert
from outbox.exceptions import OutboxConfigurationError
from outbox.models import OutboxBase, outbox_models


def configured_backends() -> tuple[type[OutboxBackend], ...]:
    """The classes `OUTBOX_BACKENDS` names, in order (imported once per value)."""
    return _import_backends(tuple(outbox_settings.BACKENDS))


@cache
def _import_backends(paths: tuple[str, ...]) -> tuple[type[OutboxBackend], ...]:
    return tuple(import_backend(path) for path in paths)


def import_backend(path: str) -> type[OutboxBackend]:
    """The backend class at a dotted path; `OutboxConfigurationError` saying why not."""
    try:
        backend = import_string(path)
    except ImportError as exc:
        raise OutboxConfigurationError(f"{path!r} cannot be imported: {exc}") from exc
    if not (isinstance(backend, type) and issubclass(backend, OutboxBackend)):
        raise OutboxConfigurationError(
            f"{path!r} is {backend!r}, not a subclass of outbox.backends.OutboxBackend"
        )
    return backend


def backend_class(using: str) -> type[OutboxBackend]:
    """The backend class that drains a database alias."""
    candidates = configured_backends()
    if not outbox_settings.FAST_PATH:
        candidates = tuple(c for c in candidates if issubclass(c, PortableBackend))
    return _first_supporting(using, candidates)


def native_class(using: str) -> type[OutboxBackend]:
    """The first backend that supports the database, whatever OUTBOX_FAST_PATH says."""
    return _first_supporting(using, configured_backends())


def _first_supporting(
    using: str, candidates: tuple[type[OutboxBackend], ...]
) -> type[OutboxBackend]:
    """Asked once per database and candidates: a flush after every commit makes a
    backend, and the answer depends only on the database's vendor and version."""
    key = (using, candidates)
    try:
        return _chosen[key]
    except KeyError:
        pass
    connection = connections[using]
    chosen = next((b for b in candidates if b.supports(connection)), PortableBackend)
    _chosen[key] = chosen
    return chosen


_chosen: dict[tuple[str, tuple[type[OutboxBackend], ...]], type[OutboxBackend]] = {}


def get_backend(using: str) -> OutboxBackend:
    """The engine backend for a database alias (a fresh instance: cheap, not shared)."""
    return backend_class(using)(using)


def commit_with_last_insert(using: str) -> CommitWithInsert | None:
    """The write path's hook: the deferred writer's COMMIT with its last INSERT, where
    the database offers it (PostgreSQL with psycopg 3). Asked once per database: it
    depends only on the database's settings and driver."""
    key = (using, tuple(outbox_settings.BACKENDS))
    try:
        return _commit_wrappers[key]
    except KeyError:
        pass
    wrapper = native_class(using).commit_with_last_insert(connections[using])
    _commit_wrappers[key] = wrapper
    return wrapper


_commit_wrappers: dict[tuple[str, tuple[str, ...]], CommitWithInsert | None] = {}


def listeners(
    models: Sequence[type[OutboxBase]] | None, using: str | None
) -> dict[str, WakeListener]:
    """An unconnected wake-up listener per database of these outbox tables (all of them
    by default) that offers one; `using` puts every table on that database."""
    by_alias: dict[str, list[type[OutboxBase]]] = defaultdict(list)
    for model in models or outbox_models():
        by_alias[using or router.db_for_write(model)].append(model)
    found = {}
    for alias, tables in by_alias.items():
        listener = native_class(alias)(alias).listener(tables)
        if listener is not None:
            found[alias] = listener
    return found


def notify_listeners(model: type[OutboxBase], using: str) -> None:
    """Tell the idle drain loops listening for `model`'s commits on `using` to look now
    (at the commit of the transaction under way), on the backend that listens for them:
    `OutboxBackend.notify_listeners`."""
    native_class(using)(using).notify_listeners(model)


def after_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """The `post_migrate` receiver: every table is migrated by then, custom ones too, so
    the database's backend sets up what it needs beyond them."""
    native_class(using)(using).after_migrate()
