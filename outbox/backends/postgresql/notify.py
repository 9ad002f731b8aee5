"""Wake-up on PostgreSQL: a trigger NOTIFYs, a connection of its own LISTENs.

Every outbox table gets a statement-level `AFTER INSERT` trigger that calls
`pg_notify` on the table's channel. The write path sends nothing more: PostgreSQL
delivers the notification when the transaction commits, once per channel however many
rows it inserted, and never if it rolls back. `sync_triggers` installs (or, with
`OUTBOX_NOTIFY` off, removes) the triggers on one database; the backend runs it after
every `migrate` (`PostgresBackend.after_migrate`), so custom outbox tables get theirs too.

`Listener` is the other end: a psycopg connection apart from Django's (autocommit, never
in a transaction) that LISTENs on the channels of the tables a drain loop serves. The
engine waits on its socket (`engine/worker.py` `Waiter`); a notification is only a hint to drain
now, so one that is lost or a connection that drops only delays delivery to the next poll.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections, router, transaction

from outbox.backends.listener import ListenerLost
from outbox.conf import outbox_settings
from outbox.models import OutboxBase, outbox_models

logger = logging.getLogger("outbox.engine")

FUNCTION = "outbox_notify"
TRIGGER = "outbox_notify"
APPLICATION_NAME = "outbox-listener"  # how the listener shows in pg_stat_activity
_MAX_CHANNEL = 63  # NAMEDATALEN - 1: pg_notify refuses longer channel names
_PLAIN = re.compile(r"[A-Za-z0-9_]+")  # a channel name safe to quote without escaping

FUNCTION_BODY = "BEGIN PERFORM pg_notify(TG_ARGV[0], ''); RETURN NULL; END"
CREATE_FUNCTION = (
    f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql "
    f"AS $outbox$ {FUNCTION_BODY} $outbox$"
)
FUNCTION_SOURCE = f"SELECT prosrc FROM pg_proc WHERE proname = '{FUNCTION}' AND pronargs = 0"
# The channel each trigger of that name passes (tgargs is NUL-terminated arguments).
TRIGGER_CHANNEL = (
    "SELECT encode(tgargs, 'escape') FROM pg_trigger "
    f"WHERE tgrelid = to_regclass(%s) AND tgname = '{TRIGGER}'"
)
_LISTENER_DEFAULTS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
# Django's own connection parameters that are no libpq parameters.
_NOT_LIBPQ = ("context", "cursor_factory", "prepare_threshold", "autocommit")


def notifies() -> bool:
    """Whether PostgreSQL databases wake their drain loops: `OUTBOX_NOTIFY` is on."""
    return bool(outbox_settings.NOTIFY)


def channel(model: type[OutboxBase]) -> str:
    """The LISTEN channel of an outbox table: `outbox_` and its table name, or a digest
    of the name where that would be too long for a channel name, or not plain."""
    table = model._meta.db_table
    name = f"outbox_{table}"
    if len(name) <= _MAX_CHANNEL and _PLAIN.fullmatch(name):
        return name
    return "outbox_" + hashlib.sha256(table.encode()).hexdigest()[:32]


def _tables_here(using: str, models: Iterable[type[OutboxBase]]) -> list[type[OutboxBase]]:
    """The outbox tables that exist on this database."""
    connection = connections[using]
    existing = set(connection.introspection.table_names())
    return [
        model
        for model in models
        if router.allow_migrate_model(using, model) and model._meta.db_table in existing
    ]


def trigger_channel(using: str, model: type[OutboxBase]) -> str | None:
    """The channel the table's trigger notifies, or None if it has none."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(TRIGGER_CHANNEL, [connection.ops.quote_name(model._meta.db_table)])
        row = cursor.fetchone()
    return row[0].removesuffix("\\000") if row else None


def sync_triggers(
    using: str, models: Sequence[type[OutboxBase]] | None = None, *, enabled: bool | None = None
) -> list[str]:
    """Give every outbox table on `using` its notify trigger (`enabled`, by default
    `OUTBOX_NOTIFY`), or take it away; idempotent, touching only tables that differ.
    Returns the tables changed. Does nothing on other databases."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return []
    enabled = outbox_settings.NOTIFY if enabled is None else enabled
    quote = connection.ops.quote_name
    changed = []
    with transaction.atomic(using), connection.cursor() as cursor:
        if enabled:
            cursor.execute(FUNCTION_SOURCE)
            if [row[0].strip() for row in cursor.fetchall()] != [FUNCTION_BODY]:
                cursor.execute(CREATE_FUNCTION)
        for model in _tables_here(using, outbox_models() if models is None else models):
            want = channel(model) if enabled else None
            if trigger_channel(using, model) == want:
                continue
            table = quote(model._meta.db_table)
            if want is None:
                cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table}")
            else:
                cursor.execute(
                    f"CREATE OR REPLACE TRIGGER {TRIGGER} AFTER INSERT ON {table} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}('{want}')"
                )
            changed.append(model._meta.db_table)
    if changed:
        logger.info(
            "outbox notify trigger %s on %s",
            "installed" if enabled else "removed",
            ", ".join(changed),
            extra={"event": "outbox.notify_triggers", "using": using, "tables": changed},
        )
    return changed


class Listener:
    """A LISTEN connection of its own on one database, for the given channels
    (`outbox.backends.listener.WakeListener`): made unconnected, connected by `connect`,
    and again after `close`."""

    def __init__(self, using: str, channels: Sequence[str]) -> None:
        self.using = using
        self.channels = list(channels)
        self.connection: Any = None
        self.fd = -1

    def connect(self) -> None:
        import psycopg

        params = connections[self.using].get_connection_params()
        for name in _NOT_LIBPQ:
            params.pop(name, None)
        params["application_name"] = APPLICATION_NAME
        # Bounded waits for a database that is away; keepalives notice a silent network
        # cut within about a minute (ignored on Unix sockets). The options win.
        for name, value in _LISTENER_DEFAULTS.items():
            params.setdefault(name, value)
        self.connection = psycopg.connect(**params, autocommit=True)
        try:
            for name in self.channels:
                self.connection.execute(f'LISTEN "{name}"')
        except BaseException:
            self.connection.close()
            self.connection = None
            raise
        self.fd = self.connection.fileno()  # to wait on; libpq closes it when it fails

    @property
    def backend_pid(self) -> int:
        return int(self.connection.info.backend_pid)

    def take(self) -> int:
        """The notifications received so far, without waiting: how many there were.
        Raises `ListenerLost` if the connection has dropped."""
        from psycopg import pq

        pgconn = self.connection.pgconn
        try:
            pgconn.consume_input()
        except Exception as exc:  # psycopg raises OperationalError; libpq may say more
            raise ListenerLost(str(exc)) from exc
        if pgconn.status != pq.ConnStatus.OK:
            raise ListenerLost(f"connection status {pq.ConnStatus(pgconn.status).name}")
        count = 0
        while pgconn.notifies() is not None:
            count += 1
        return count

    def close(self) -> None:
        if self.connection is None:
            return
        try:
            self.connection.close()
        except Exception:  # closing a dead connection: nothing to save
            logger.debug("closing the outbox listener failed", exc_info=True)
        self.connection, self.fd = None, -1
