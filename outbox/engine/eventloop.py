"""The drain's own event loop, where `async def` receivers are awaited.

A drain delivering on slot threads (`outbox.engine.slots`) starts one event loop on a
thread of its own the first time an async receiver is called. Shards whose receivers
are all `async def` are delivered there by coroutines, up to the concurrency at once
(`AwaitedShards`), with no slot thread waiting for them; a slot delivering a category
with sync receivers too awaits its async ones there (`async_caller`). Either way many
shards' calls wait on the network at once in one loop. A call past
`OUTBOX_RECEIVER_TIMEOUT_SECONDS` is cancelled and fails with `TimeoutError`.

Outside such a drain (the synchronous flush after commit, a drain with concurrency 1)
an async receiver is run with `asgiref.sync.async_to_sync`, as Django's `Signal.send`
does: the caller needs no running loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.db import connections

from outbox.conf import outbox_settings
from outbox.signals import receiver_id

_T = TypeVar("_T")
_current = threading.local()  # .loop: the EventLoop of the drain this thread serves


class EventLoop:
    """An event loop running on a daemon thread until `close()`, and one thread beside it
    for the sync work of its coroutines (`in_sync_thread`)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sync_thread = concurrent.futures.ThreadPoolExecutor(1, "outbox-event-loop-sync")
        _sync_threads[self.loop] = self.sync_thread
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="outbox-event-loop", daemon=True
        )
        self._thread.start()

    def run(
        self,
        coroutine: Coroutine[Any, Any, Any],
        timeout: float | None,
        receiver: Callable[..., Any] | None = None,
    ) -> Any:
        """Await `coroutine` (a call of `receiver`, named in a timeout's error) on the
        loop; cancel it after `timeout` seconds."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            named = f" {receiver_id(receiver)}" if receiver is not None else ""
            raise TimeoutError(
                f"async receiver{named} cancelled after {timeout}s "
                "(OUTBOX_RECEIVER_TIMEOUT_SECONDS)"
            ) from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self.sync_thread.submit(connections.close_all).result()  # that thread's own
        self.sync_thread.shutdown()
        _sync_threads.pop(self.loop, None)


# Each drain loop's thread for sync work, by loop.
_sync_threads: dict[asyncio.AbstractEventLoop, concurrent.futures.ThreadPoolExecutor] = {}


async def in_sync_thread(function: Callable[[], _T]) -> _T:
    """Run `function` on the sync thread beside the running drain loop, and await it.

    Django refuses ORM queries in a thread that runs an event loop
    (SynchronousOnlyOperation), and a coroutine must not block its loop: the lease
    confirmations, failures and lifecycle signals of shards awaited on the loop run there.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_sync_threads.get(loop), function)


class LazyEventLoop:
    """One drain's event loop, started at its first async call."""

    def __init__(self) -> None:
        self._loop: EventLoop | None = None
        self._lock = threading.Lock()

    def get(self) -> EventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = EventLoop()
            return self._loop

    def serve_this_thread(self) -> None:
        """Async receivers called on this thread are awaited on this drain's loop."""
        _current.loop = self

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()


def async_caller(receiver: Callable[..., Any]) -> Callable[..., Any]:
    """A plain callable that awaits the `async def` receiver: on the drain's event loop
    where the calling thread serves one, else through `async_to_sync`."""
    fallback = async_to_sync(receiver)

    def call(**kwargs: Any) -> Any:
        lazy: LazyEventLoop | None = getattr(_current, "loop", None)
        if lazy is None:
            return fallback(**kwargs)
        timeout = outbox_settings.RECEIVER_TIMEOUT_SECONDS or None
        return lazy.get().run(receiver(**kwargs), timeout, receiver)

    return call


class AwaitedShards:
    """Shards delivered by coroutines on a drain's loop, at most `limit` at once."""

    def __init__(self, loop: LazyEventLoop, limit: int) -> None:
        self._loop = loop
        self._free = threading.BoundedSemaphore(limit)

    def start(
        self,
        coroutine: Callable[[], Coroutine[Any, Any, None]],
        done: Callable[[concurrent.futures.Future[None]], None],
        give_up: Callable[[], bool],
    ) -> bool:
        """Run `coroutine()` on the loop once fewer than `limit` run, then `done` with
        its future; False (nothing started) if `give_up()` turns true while waiting."""
        while not self._free.acquire(timeout=0.05):
            if give_up():
                return False
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine(), self._loop.get().loop)
        except BaseException:
            self._free.release()
            raise

        def finished(future: concurrent.futures.Future[None]) -> None:
            self._free.release()
            done(future)

        future.add_done_callback(finished)
        return True
