"""Delivery: one shard's groups to their receivers, in order, one call at a time, and
what a failed call leaves behind. Each part below needs only the parts above it.

The drain's event loop
----------------------
The drain's own event loop, where `async def` receivers are awaited.

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

Calling the receivers of one group
----------------------------------
Calling the receivers of one coalescing group, each on its own.

Every receiver of a category runs for a message even when another one raises. The
receivers that succeeded are reported with the failure, so that the retry of the same
newest row skips them; the happy path records nothing. Transactional receivers run
together inside the transaction that deletes the rows: one failure rolls them all
back, so none of them counts as done.

A category whose receivers are all `async def` (and not transactional) can also be
awaited from a coroutine (`ReceiverCalls.asend`), each receiver cancelled at
`OUTBOX_RECEIVER_TIMEOUT_SECONDS`.

A failure recorded
------------------
A receiver failure recorded: the retry policy (`outbox.retry`) decides whether the
message is a dead letter and when each row is retried; this turns its answer into a
FailedGroup for the backend, logs it, and announces it by signal if anyone listens.

What a slot delivers
--------------------
What a slot delivers: a `ShardTask` is one shard; a `BulkTask` is a window's shards
taken in turn, while receivers return at once, into one round with no object per shard
(`outbox.engine.slots` queues them). Either way one shard is delivered by one slot,
one call at a time, in order.

A task still in a call `STRAGGLER_SECONDS` after the last shard was taken from the queue
is carved out (`detached`): the window is settled without its shard, which it finishes
on its own (`outbox.engine.slots`). A carved bulk task hands the window what it did
before that shard (`window_part`).

One shard's groups in order
---------------------------
Delivering one shard's groups in order, one call at a time, into a round.

A shard stops at its first failing group, so its later groups keep waiting in order; a
group given up as a dead letter is recorded and its shard goes on. Before each call the
lease is confirmed if its renewal is overdue, and a shard whose lease was lost stops.

A shard whose groups go only to `async def` receivers (none transactional) can instead
be delivered by a coroutine on the drain's event loop (`deliver_on_loop`): many such
shards then wait on the network at once without a thread each (`outbox.engine.slots`
starts them). Their receivers are cancelled at `OUTBOX_RECEIVER_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.dispatch import Signal

from outbox import tracing
from outbox.backends.base import FailedGroup, Group, Lease, OutboxBackend, Settlement
from outbox.categories import OutboxCategory, registry
from outbox.conf import outbox_settings
from outbox.engine.pipeline import Holding, Round, retrying, send_processed
from outbox.exceptions import NoReceiver, OutboxError, RetryLater
from outbox.internals import has_async_receivers, live_receivers
from outbox.models import OutboxBase
from outbox.models.causes import error_line
from outbox.retry import Failure, policy_for
from outbox.shards import ShardKey
from outbox.shown_text import one_line, shown_traceback
from outbox.signals import (
    delivery_failed,
    message_dead_lettered,
    receiver_id,
    transactional_pairs,
)

# --- The drain's event loop ---------------------------------------------------------

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


# --- Calling the receivers of one group ---------------------------------------------

_NONE_DONE: frozenset[str] = frozenset()


class LeaseLost(OutboxError):
    """Raised inside a transactional delivery to roll the receiver's writes back."""


class DeliveryFailed(OutboxError):
    """Some receivers of a message raised. `errors` holds (receiver id, exception) per
    failing receiver; `delivered_to` every receiver id done for this newest row, those
    of earlier attempts included."""

    def __init__(self, errors: list[tuple[str, Exception]], delivered_to: list[str]) -> None:
        super().__init__("; ".join(f"{name}: {exc!r}" for name, exc in errors))
        self.errors = errors
        self.delivered_to = delivered_to


class ReceiverCalls:
    """Delivery to one outbox table's receivers, for one window of messages.

    Each category's receivers, and whether they are transactional, are looked up once per
    window rather than once per message: a receiver connected or disconnected meanwhile
    takes effect from the next window.
    """

    def __init__(self, model: type[OutboxBase], using: str, *, timed: bool = False) -> None:
        self.model = model
        self.using = using
        self.signal = model.process_signal
        self._routes: dict[int, _Route] = {}
        # With `timed`, each send records how long every receiver took (receiver id,
        # seconds) in `timings`; without, the happy path measures nothing.
        self.timings: list[tuple[str, float]] | None = [] if timed else None
        # Set while a tracer provider is: each message's delivery then has a span.
        self.tracer = tracing.delivery_tracer()

    def send(
        self, group: Group, retire: Callable[[], bool], kwargs: dict[str, Any] | None = None
    ) -> bool:
        """Call the group's receivers with its newest payload (`kwargs`: the receivers'
        keyword arguments, when already made).

        Returns True when the group's rows were already deleted, inside the receivers'
        own transaction (transactional receivers); False when the caller must retire
        them. Raises DeliveryFailed when a receiver raised (after the others ran); a
        category with no receiver raises NoReceiver.
        """
        route = self._routes.get(group.category) or self._route(group.category)
        message = group.message
        assert message is not None  # a group whose row is gone is not sent
        if kwargs is None:
            kwargs = self.model.message_kwargs(message)
            kwargs["using"] = self.using
            if self.tracer is not None:  # the same send, inside the delivery's span
                with tracing.delivery_span(self.tracer, kwargs, route.category):
                    return self.send(group, retire, kwargs)
        timings = self.timings
        if not route.transactional:
            # The hot path: no timings, no receiver done before (`_done_before`, inline).
            if timings is None and not message.delivered_to:
                route.send_all(kwargs)
                return False
            if timings is not None:
                timings.clear()
            route.send(kwargs, _done_before(message), robust=True, timings=timings)
            return False
        if timings is not None:
            timings.clear()
        try:
            with transaction.atomic(using=self.using):
                route.send(kwargs, frozenset(), robust=False, timings=timings)
                if not retire():
                    raise LeaseLost(f"lease of shard {group.shard} was lost")
        except DeliveryFailed as failed:
            # Rolled back: nothing any of them did counts.
            raise DeliveryFailed(failed.errors, []) from None
        return True

    def awaitable(self, category: int) -> bool:
        """The category's receivers are all `async def` and none is transactional."""
        return self._route(category).awaitable

    async def asend(self, group: Group) -> None:
        """`send` for a category that is `awaitable`: await its receivers in turn."""
        timings = self.timings
        if timings is not None:
            timings.clear()
        kwargs = self.model.message_kwargs(group.message)
        kwargs["using"] = self.using
        route = self._route(group.category)
        if self.tracer is None:
            await route.asend(kwargs, _done_before(group.message), timings)
            return
        with tracing.delivery_span(self.tracer, kwargs, route.category):
            await route.asend(kwargs, _done_before(group.message), timings)

    def sibling(self) -> ReceiverCalls:
        """Another delivery to the same receivers, with timings of its own (for a
        coroutine running beside others)."""
        other = ReceiverCalls(self.model, self.using, timed=self.timings is not None)
        other._routes = self._routes
        other.tracer = self.tracer
        return other

    def _route(self, category: int) -> _Route:
        route = self._routes.get(category)
        if route is None:
            route = self._routes[category] = _Route(self.signal, category)
        return route


def _done_before(message: Any) -> frozenset[str]:
    """The receivers a failed earlier attempt recorded as done for this very row."""
    recorded = getattr(message, "delivered_to", "")
    return frozenset(json.loads(recorded)) if recorded else _NONE_DONE


def send(model: type[OutboxBase], group: Group, retire: Callable[[], bool], using: str) -> bool:
    """Deliver one group on its own (see `ReceiverCalls.send`)."""
    return ReceiverCalls(model, using).send(group, retire)


class _Route:
    """One category's receivers, as looked up for a window."""

    def __init__(self, signal: Signal, value: int) -> None:
        self.signal = signal
        self.category = registry.category(value)
        self.transactional = (id(signal), self.category) in transactional_pairs
        sync_receivers, async_receivers = _live(signal, self.category)
        self.receivers = [
            *((r, r) for r in sync_receivers),
            *((r, async_caller(r)) for r in async_receivers),
        ]
        self.async_receivers = async_receivers
        self.awaitable = bool(async_receivers) and not sync_receivers and not self.transactional

    def send_all(self, kwargs: dict[str, Any]) -> None:
        """`send` (robust) with no receiver done before and no timings: the happy path
        calls the receivers and nothing more; which ones succeeded is worked out only
        when one raised."""
        receivers, signal, category = self.receivers, self.signal, self.category
        if not receivers:
            raise NoReceiver(f"no receiver is connected for category {category.name}")
        errors: list[tuple[Callable[..., Any], Exception]] | None = None
        # In the message's own dict, so that a call unpacks one dict rather than merging
        # two into a new one first (each receiver still gets a dict of its own).
        kwargs["signal"], kwargs["sender"] = signal, category
        for receiver, call in receivers:
            try:
                call(**kwargs)
            except Exception as exc:
                if errors is None:
                    errors = []
                errors.append((receiver, exc))
        if errors is not None:
            failed = [receiver for receiver, _ in errors]
            succeeded = [r for r, _ in receivers if not any(r is f for f in failed)]
            named = [(receiver_id(receiver), exc) for receiver, exc in errors]
            _raise_failed(named, _NONE_DONE, succeeded)

    def send(
        self,
        kwargs: dict[str, Any],
        done: frozenset[str],
        *,
        robust: bool,
        timings: list[tuple[str, float]] | None = None,
    ) -> None:
        receivers, signal, category = self.receivers, self.signal, self.category
        # No receiver connected: never count that as delivered.
        if not receivers:
            raise NoReceiver(f"no receiver is connected for category {category.name}")
        tally = _Tally(done, timings)
        for receiver, call in receivers:
            if tally.skips(receiver):
                continue
            started, error = tally.clock(), None
            try:
                call(signal=signal, sender=category, **kwargs)
            except Exception as exc:
                error = exc
            tally.ended(receiver, started, error)
            if error is not None and not robust:
                break
        tally.raise_failed()

    async def asend(
        self, kwargs: dict[str, Any], done: frozenset[str], timings: list[tuple[str, float]] | None
    ) -> None:
        """`send` (robust) of an `awaitable` route, from a coroutine."""
        signal, category = self.signal, self.category
        tally = _Tally(done, timings)
        for receiver in self.async_receivers:
            if tally.skips(receiver):
                continue
            started, error = tally.clock(), None
            try:
                await _awaited(receiver, {"signal": signal, "sender": category, **kwargs})
            except Exception as exc:
                error = exc
            tally.ended(receiver, started, error)
        tally.raise_failed()


class _Tally:
    """What one message's receivers did, one call after another: which were done before
    (skipped), which succeeded, which raised what, and how long each took (where
    `timings` is kept). Receiver ids are worked out only when needed (a retry, a
    failure, timings)."""

    __slots__ = ("done", "errors", "succeeded", "timings")

    def __init__(self, done: frozenset[str], timings: list[tuple[str, float]] | None) -> None:
        self.done = done
        self.timings = timings
        self.succeeded: list[Callable[..., Any]] = []
        self.errors: list[tuple[str, Exception]] = []

    def skips(self, receiver: Callable[..., Any]) -> bool:
        return bool(self.done) and receiver_id(receiver) in self.done

    def clock(self) -> float:
        return time.perf_counter() if self.timings is not None else 0.0

    def ended(self, receiver: Callable[..., Any], started: float, error: Exception | None) -> None:
        if error is None:
            self.succeeded.append(receiver)
        else:
            self.errors.append((receiver_id(receiver), error))
        if self.timings is not None:
            self.timings.append((receiver_id(receiver), time.perf_counter() - started))

    def raise_failed(self) -> None:
        _raise_failed(self.errors, self.done, self.succeeded)


def _raise_failed(
    errors: list[tuple[str, Exception]], done: frozenset[str], succeeded: list[Callable[..., Any]]
) -> None:
    """Raise DeliveryFailed if any receiver raised, naming every receiver done for the row."""
    if errors:
        raise DeliveryFailed(errors, [*done, *map(receiver_id, succeeded)])


async def _awaited(receiver: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Await one receiver call; cancelled at OUTBOX_RECEIVER_TIMEOUT_SECONDS."""
    timeout = outbox_settings.RECEIVER_TIMEOUT_SECONDS or None
    try:
        await asyncio.wait_for(receiver(**kwargs), timeout)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise TimeoutError(
            f"async receiver {receiver_id(receiver)} cancelled after {timeout}s "
            "(OUTBOX_RECEIVER_TIMEOUT_SECONDS)"
        ) from None


def _live(
    signal: Signal, category: OutboxCategory
) -> tuple[list[Callable[..., Any]], list[Callable[..., Any]]]:
    """The live sync and async receivers for `category`; sync ones run first, as
    `send_robust` orders them.

    Django has no public way to call receivers one by one and skip some: see
    `outbox.internals.live_receivers`.
    """
    if not signal.receivers:
        return [], []
    return live_receivers(signal, category)


# --- A failure recorded -------------------------------------------------------------

logger = logging.getLogger("outbox.engine")

_ERROR_LIMIT = 4000
_TRACEBACK_LIMIT = 20000
_FAILED = "outbox receiver failed for message %s, shard %s category %s object %s (attempt %s)%s: %s"


def judge(
    model: type[OutboxBase], group: Group, exc: Exception, using: str
) -> tuple[FailedGroup, bool]:
    """Turn a failed delivery into a FailedGroup, and whether it is dead; log it and send
    the lifecycle signals."""
    named = exc.errors if isinstance(exc, DeliveryFailed) else [("", exc)]
    done = exc.delivered_to if isinstance(exc, DeliveryFailed) else []
    errors = [error for _, error in named]
    policy = policy_for(group.category)
    failure = Failure(group.category, tuple(group.attempts), tuple(errors))
    dead = policy.is_final(failure)
    if dead:
        delays = dict.fromkeys(group.row_ids, 0.0)
    else:
        delays = dict(zip(group.row_ids, policy.row_delays(failure), strict=True))
    described = _describe(named)
    failed = FailedGroup(
        group.shard,
        delays,
        described[:_ERROR_LIMIT],
        delays[group.row_ids[0]],
        traceback="\n".join(_format(error) for error in errors)[-_TRACEBACK_LIMIT:],
        delivered_to=_encode(done),
        asked_later=all(isinstance(error, RetryLater) for error in errors),
    )
    _announce(model, group, errors[0], described, dead, using)
    return failed, dead


def _describe(named: list[tuple[str, Exception]]) -> str:
    # Each failure names its receiver, a lone one too: dead letters are grouped by it.
    return "\n".join(error_line(name, exc) for name, exc in named)


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _encode(done: list[str]) -> str:
    return json.dumps(sorted(set(done))) if done else ""


def _announce(
    model: type[OutboxBase],
    group: Group,
    exc: Exception,
    described: str,
    dead: bool,
    using: str,
) -> None:
    """Log the failure and send the signals; they carry the error as recorded, the log
    shows it cut with a marker saying how much of `described` went."""
    common = {
        "shard": group.shard,
        "category": group.category,
        "object_identifier": group.object_identifier,
        "attempts": group.attempts[0] + 1,
        "message_id": getattr(group.message, "message_id", None),
        "error": described[:_ERROR_LIMIT],
        "using": using,
    }
    _log(model, exc, dead, common, one_line(described))
    if delivery_failed.has_listeners(model):
        delivery_failed.send(sender=model, exception=exc, dead=dead, **common)
    if dead and message_dead_lettered.has_listeners(model):
        message_dead_lettered.send(sender=model, **common)


def _log(
    model: type[OutboxBase], exc: Exception, dead: bool, failure: dict[str, Any], shown: str
) -> None:
    """Log the failure with the receivers' text as `shown` (escaped and cut by
    `outbox.shown_text`) and a traceback made the same way: it can neither forge a log
    line, nor reach a terminal as escapes, nor make a huge record. The exception still
    goes with the record (`exc_info`), for the handlers that read it."""
    level = logging.ERROR if dead else logging.WARNING
    if not logger.isEnabledFor(level):
        return
    shard = failure["shard"]
    args = (
        failure["message_id"],
        registry.shard_name(shard, "noted"),
        registry.category_name(failure["category"], "noted"),
        failure["object_identifier"],
        failure["attempts"],
        ", dead-lettered" if dead else ", will retry",
        shown,
    )
    path, line, function, _ = logger.findCaller()
    record = logger.makeRecord(
        logger.name,
        level,
        path,
        line,
        _FAILED,
        args,
        (type(exc), exc, exc.__traceback__),
        function,
        extra={
            "event": "outbox.dead_lettered" if dead else "outbox.delivery_failed",
            "outbox": model._meta.label,
            "scope": shard.shard_scope,
            "shard": str(shard),
            "category": failure["category"],
            "object_identifier": failure["object_identifier"],
            "attempts": failure["attempts"],
            "message_id": str(failure["message_id"]),
        },
    )
    # A formatter writes `exc_text`, when set, in place of the traceback it would
    # format from `exc_info`, which repeats the receiver's text as it is.
    record.exc_text = shown_traceback(exc, _TRACEBACK_LIMIT)
    logger.handle(record)


# --- What a slot delivers -----------------------------------------------------------

# Receivers wait on something (wake the other slots) when calls take this long on
# average over a few calls, or one call takes SLOW_ONE_CALL_SECONDS, or is still running
# after STALLED_CALL_SECONDS; waits for the GIL or the garbage collector stay below them.
SLOW_CALL_SECONDS = 0.001
SLOW_ONE_CALL_SECONDS = 0.005
STALLED_CALL_SECONDS = 0.02
# How long the drain waits for a window's last running shards before carving them out:
# past STALLED_CALL_SECONDS, so a thread merely waiting for the CPU is not carved, and
# short, since until then the window's next claim waits, and every other shard with it.
STRAGGLER_SECONDS = 0.05


class Abandoned(BaseException):
    """Unwinds a slot whose call was given up (timed out) once that call returns.

    A BaseException, so the engine's `except Exception` around receivers lets it pass.
    """


class ShardTask:
    """One shard delivered by one slot: what it did (`round`), the call running now
    (`receiver_started`, `group`), and whether the drain has carved it out (`detached`)
    or given its call up (`abandoned`). `lock` is the window's."""

    __slots__ = (
        "abandoned",
        "call_seconds",
        "calls",
        "detached",
        "error",
        "finished",
        "group",
        "groups",
        "lock",
        "on_finish",
        "on_loop",
        "receiver_started",
        "round",
        "shard",
        "thread",
        "window_part",
    )

    def __init__(self, shard: ShardKey, groups: list[Group], lock: threading.Lock) -> None:
        self.shard = shard
        self.groups = groups
        self.round = Round()
        self.lock = lock
        self.receiver_started: float | None = None
        self.group: Group | None = None
        self.finished = False
        self.detached = False
        self.abandoned = False
        self.calls = 0
        self.call_seconds = 0.0
        self.thread: threading.Thread | None = None
        self.on_loop = False  # delivered by a coroutine on the drain's loop, no thread
        self.error: BaseException | None = None
        self.on_finish: Callable[[ShardTask], None] | None = None
        # A carved bulk task's deliveries of other shards, settled with the window.
        self.window_part: Round | None = None

    def begin_call(self, group: Group) -> float:
        self.group = group
        started = self.receiver_started = time.monotonic()
        return started

    def end_call(self) -> None:
        """After each call: a call given up meanwhile ends the task here.

        Lock-free unless the task is detached: `carve` marks it detached before it
        looks at `receiver_started`, so a call ending while the drain carves or gives
        it up waits here for the lock, and the drain sees a round that stands still.
        """
        started, self.receiver_started = self.receiver_started, None
        if started is not None:
            self.calls += 1
            self.call_seconds += time.monotonic() - started
        if self.detached:
            with self.lock:
                if self.abandoned:
                    raise Abandoned

    @property
    def slow(self) -> bool:
        """Its calls wait on something (see SLOW_CALL_SECONDS)."""
        calls, seconds = self.calls, self.call_seconds
        return bool(calls) and (
            seconds >= SLOW_ONE_CALL_SECONDS * calls
            or (calls >= 3 and seconds >= SLOW_CALL_SECONDS * calls)
        )

    def running_for(self, now: float) -> float:
        started = self.receiver_started
        return now - started if started is not None else 0.0

    def carve(self) -> bool:
        """Detach this task from its window (under the window's lock); False: not now."""
        self.detached = True
        return True

    def straggler_round(self) -> Round:
        """What this task did that the window's settle left out (under the lock)."""
        return self.round.copy()


class BulkTask(ShardTask):
    """One slot delivering a window's queued shards in turn into one round; `shard` is
    the one it works on now."""

    __slots__ = ("reserved", "snapshot")

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(ShardKey("", 0, 0), [], lock)
        self.snapshot: Round | None = None
        # Shards taken from the queue ahead, a few at a time, so that the hot path
        # takes the lock once per few shards; handed back when other slots join.
        self.reserved: deque[tuple[ShardKey, list[Group]]] = deque()

    def carve(self) -> bool:
        """Only while a call runs is the round still: then everything but the current
        shard goes to the window, and this shard becomes a straggler."""
        self.detached = True  # first: see `end_call`
        if self.receiver_started is None:
            self.detached = False
            return False
        self.snapshot = self.round.copy()
        self.window_part = self.snapshot.without(self.shard)
        return True

    def straggler_round(self) -> Round:
        assert self.snapshot is not None
        return self.round.only(self.shard, since=self.snapshot)


# --- One shard's groups in order ----------------------------------------------------


class ShardDeliverer:
    """Delivers shards of one window under its lease (`holding`), with the receivers
    looked up once for the window. One per thread: `calls` records its timings."""

    def __init__(
        self,
        model: type[OutboxBase],
        using: str,
        backend: OutboxBackend,
        stop: threading.Event,
        holding: Holding,
        *,
        report_processed: bool,
    ) -> None:
        self.model = model
        self.using = using
        self.backend = backend
        self.stop = stop
        self.holding = holding
        self.report_processed = report_processed
        self.calls = ReceiverCalls(model, using, timed=report_processed)
        self._awaitable: dict[int, bool] = {}  # by category, for this window
        # The group `_deliver_group` sends now, and its round: what `_retire_sending`
        # retires (a bound method made once: the hot path makes no closure per call).
        self._sending_group: Group | None = None
        self._sending_round: Round | None = None
        self._retire = self._retire_sending
        # No async receiver at all (the usual case): no shard is ever awaitable.
        self.any_async = has_async_receivers(model.process_signal)

    def deliver(
        self, shard: ShardKey, groups: list[Group], round_: Round, call: Holding | ShardTask
    ) -> bool:
        """Deliver one shard's groups (see `deliver_each`)."""
        return self.deliver_each(((shard, groups),), round_, call)

    def deliver_each(
        self,
        shards: Iterable[tuple[ShardKey, list[Group]]],
        round_: Round,
        call: Holding | ShardTask,
    ) -> bool:
        """Deliver each shard's groups in order until one fails, shard after shard; False
        when stopping. `call` records the call running now (for the keeper, or the
        slots). One loop over a window's shards: with one message per shard, a call per
        shard would cost as much as the message."""
        # The hot path of receivers that return at once: the lease check and `_may_call`
        # inlined.
        stop, holding = self.stop, self.holding
        overdue_after = holding.lease.seconds / 2  # see Holding
        for shard, groups in shards:
            for group in groups:
                if stop.is_set():
                    return False
                if time.monotonic() - holding.renewed_at >= overdue_after:
                    self._confirm_lease(holding)
                if holding.lost and shard in holding.lost:  # an empty set: no hashing
                    round_.lost.add(shard)
                    break
                if group.message is None:
                    break  # removed by an operator meanwhile; the next read sees the rest
                if not self._deliver_group(group, round_, call):
                    break
        return True

    def awaitable(self, groups: list[Group]) -> bool:
        """Every group's receivers are `async def` only: `deliver_on_loop` can take it."""
        known = self._awaitable
        for group in groups:
            category = group.category
            answer = known.get(category)
            if answer is None:
                answer = known[category] = self.calls.awaitable(category)
            if not answer:
                return False
        return True

    async def deliver_on_loop(self, task: ShardTask) -> None:
        """`deliver` of an `awaitable` shard, as a coroutine on the drain's event loop;
        what may touch the database or call other code (the lease check, a failure,
        lifecycle signals) runs on the loop's sync thread."""
        calls = self.calls.sibling()  # its own timings, beside other coroutines
        shard, round_, stop, holding = task.shard, task.round, self.stop, self.holding
        for group in task.groups:
            if stop.is_set():
                return
            if holding.renewal_overdue(time.monotonic()):
                await in_sync_thread(partial(self._confirm_lease, holding))
            if not self._may_call(shard, group, round_):
                return
            started = task.begin_call(group)
            error: Exception | None = None
            try:
                await calls.asend(group)
            except Exception as exc:
                error = exc
            finally:
                task.end_call()
            if error is None:
                if self.report_processed:
                    await in_sync_thread(partial(self._processed, group, started, calls))
                self._delivered(group, round_)
            elif not await in_sync_thread(partial(self._failed_call, group, error, round_)):
                return

    def _may_call(self, shard: ShardKey, group: Group, round_: Round) -> bool:
        """Whether the shard may go on to `group`: its lease held (as last confirmed),
        the row still there."""
        if shard in self.holding.lost:
            round_.lost.add(shard)
            return False
        return group.message is not None  # None: removed by an operator meanwhile

    def _confirm_lease(self, holding: Holding) -> None:
        """Before the next receiver call: if the lease may have lapsed since its last
        renewal (a receiver ran past the deadline, so the keeper stopped renewing it, or
        the keeper fell behind), renew it here first. Shards another worker took
        meanwhile are lost: their rows, read before, may be delivered and gone already."""
        if not holding.renewal_overdue(time.monotonic()):
            return
        held = retrying(self.backend, lambda: self.backend.renew(self.model, holding.lease))
        holding.renewed_at = time.monotonic()
        holding.lost.update(key for key in holding.lease.shards if key not in held)

    def _deliver_group(self, group: Group, round_: Round, call: Holding | ShardTask) -> bool:
        """Deliver one group; False when its shard must stop here."""
        started = call.begin_call(group)
        self._sending_group, self._sending_round = group, round_
        error: Exception | None = None
        try:
            retired_inline = self.calls.send(group, self._retire)
        except Exception as exc:
            error = exc
        finally:
            call.end_call()  # before the round changes: see ShardTask.end_call
        if error is not None:
            return self._failed_call(group, error, round_)
        # `_delivered`, inlined on the hot path (a transactional delivery retired its rows).
        round_.receiver_calls += 1
        round_.groups_delivered += 1
        if not retired_inline:
            # Not `setdefault(shard, [])`: that makes a list per call, kept or not.
            delivered = round_.delivered.get(group.shard)
            if delivered is None:
                round_.delivered[group.shard] = list(group.row_ids)
            else:
                delivered.extend(group.row_ids)
        if self.report_processed:
            self._processed(group, started, self.calls)
        return True

    def _retire_sending(self) -> bool:
        """Retire the group being sent inside its transactional receivers' transaction;
        False when its lease was lost."""
        group, round_ = self._sending_group, self._sending_round
        assert group is not None and round_ is not None
        return not self._retire_now(self.holding.lease, {group.shard: group.row_ids}, round_)

    @staticmethod
    def _delivered(group: Group, round_: Round) -> None:
        round_.receiver_calls += 1
        round_.groups_delivered += 1
        round_.delivered.setdefault(group.shard, []).extend(group.row_ids)

    def _processed(self, group: Group, started: float, calls: ReceiverCalls) -> None:
        timings = dict(calls.timings or ())
        duration = time.monotonic() - started
        send_processed(self.model, group, duration, self.using, timings)

    def _failed_call(self, group: Group, exc: Exception, round_: Round) -> bool:
        """Record a call that raised; True when its shard goes on (the group is dead)."""
        if isinstance(exc, LeaseLost):
            round_.receiver_calls += 1
            round_.lost.add(group.shard)
            return False
        round_.receiver_calls += isinstance(exc, DeliveryFailed)
        failed, dead = judge(self.model, group, exc, self.using)
        (round_.dead if dead else round_.failures).append(failed)
        return dead

    def _retire_now(
        self, lease: Lease, row_ids: dict[ShardKey, list[int]], round_: Round
    ) -> set[ShardKey]:
        """Delete a group's rows inside its transactional receiver's transaction."""
        settled = self.backend.settle(self.model, lease, Settlement(delivered=row_ids))
        if not settled.lost:
            round_.retired_inline += settled.deleted
        return set(settled.lost)
