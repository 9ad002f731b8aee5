"""Calling the receivers of one coalescing group, each on its own.

Every receiver of a category runs for a message even when another one raises. The
receivers that succeeded are reported with the failure, so that the retry of the same
newest row skips them; the happy path records nothing. Transactional receivers run
together inside the transaction that deletes the rows: one failure rolls them all
back, so none of them counts as done.

A category whose receivers are all `async def` (and not transactional) can also be
awaited from a coroutine (`ReceiverCalls.asend`), each receiver cancelled at
`OUTBOX_RECEIVER_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.dispatch import Signal

from outbox import tracing
from outbox.backends.base import Group
from outbox.categories import OutboxCategory, registry
from outbox.conf import outbox_settings
from outbox.engine.eventloop import async_caller
from outbox.exceptions import NoReceiver, OutboxError
from outbox.internals import live_receivers
from outbox.models import OutboxBase
from outbox.signals import is_transactional, receiver_id

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
        self.transactional = is_transactional(signal, self.category)
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
        # Receiver ids are worked out only when needed (a retry, a failure): the happy
        # path calls the receivers and nothing more.
        succeeded: list[Callable[..., Any]] = []
        errors: list[tuple[str, Exception]] = []
        for receiver, call in receivers:
            if done and receiver_id(receiver) in done:
                continue
            started = time.perf_counter() if timings is not None else 0.0
            try:
                call(signal=signal, sender=category, **kwargs)
            except Exception as exc:
                errors.append((receiver_id(receiver), exc))
                if not robust:
                    break
            else:
                succeeded.append(receiver)
            finally:
                if timings is not None:
                    timings.append((receiver_id(receiver), time.perf_counter() - started))
        _raise_failed(errors, done, succeeded)

    async def asend(
        self, kwargs: dict[str, Any], done: frozenset[str], timings: list[tuple[str, float]] | None
    ) -> None:
        """`send` (robust) of an `awaitable` route, from a coroutine."""
        signal, category = self.signal, self.category
        succeeded: list[Callable[..., Any]] = []
        errors: list[tuple[str, Exception]] = []
        for receiver in self.async_receivers:
            if done and receiver_id(receiver) in done:
                continue
            started = time.perf_counter()
            try:
                await _awaited(receiver, {"signal": signal, "sender": category, **kwargs})
            except Exception as exc:
                errors.append((receiver_id(receiver), exc))
            else:
                succeeded.append(receiver)
            finally:
                if timings is not None:
                    timings.append((receiver_id(receiver), time.perf_counter() - started))
        _raise_failed(errors, done, succeeded)


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
