"""What a backend's wake-up listener offers an idle drain loop (`engine/worker.py` `Waiter`).

A database that can tell a waiting process that rows were committed (PostgreSQL's
LISTEN/NOTIFY) hands the engine a listener per database (`OutboxBackend.listener`): a
connection of its own, with a file descriptor to wait on in `select()`. A wake-up is
only a hint to drain now; the loop still polls, so a listener that misses one or drops
only delays delivery to the next poll.
"""

from __future__ import annotations

from typing import Protocol


class ListenerLost(Exception):
    """The listener's connection is gone; close it and connect again."""


class WakeListener(Protocol):
    """A listener on one database's outbox tables, made unconnected.

    `connect()` opens its connection (raising if the database is away; the engine tries
    again later) and may be called again after `close()`. `fd` is the file descriptor to
    wait on while connected. `take()` returns, without waiting, how many wake-ups arrived
    since the last call, and raises `ListenerLost` once the connection has dropped.
    `close()` is quiet, and does nothing when not connected.
    """

    using: str
    fd: int

    def connect(self) -> None: ...

    def take(self) -> int: ...

    def close(self) -> None: ...
