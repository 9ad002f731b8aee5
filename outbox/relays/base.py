"""What every relay shares: the message it forwards, how it is connected to categories,
and how a failed publish becomes a retry, a delay or a dead letter.

A relay is a receiver you declare instead of write. It is connected like one (to the
process signals, for some categories or whole scopes), so it keeps everything a receiver
has: one call at a time per shard, in order; other receivers of the category still run;
a failure backs the shard off and dead-letters by the same retry policy; on a retry a
relay that already published the message is not called again. A relay only says how to
publish a batch of messages and which of them failed.
"""

from __future__ import annotations

import importlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from django.core.checks import CheckMessage, Error

from outbox.categories import OutboxCategory, OutboxScope
from outbox.exceptions import OutboxConfigurationError, PermanentFailure
from outbox.relays.batching import Batcher
from outbox.relays.envelope import CloudEvents, Envelope, envelope_named
from outbox.relays.message import Message
from outbox.signals import process_control_outbox, process_region_outbox

__all__ = ["Message", "Relay", "relays"]

# Every relay declared in this process, by name: the system checks read it.
relays: dict[str, Relay] = {}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


Failures = Mapping[uuid.UUID, BaseException]


class RelayClientMissing(OutboxConfigurationError, ImportError):
    """A relay's client library is not installed; the text names the extra to install."""


def client_library(module: str, relay: str, library: str, extra: str) -> Any:
    """The client library a relay imports when it is declared (`module`), or
    RelayClientMissing naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise RelayClientMissing(
            f'{relay} needs {library}: pip install "django-outboxes[{extra}]" ({error}).'
        ) from error


def whole_number(relay: str, option: str, value: object, none_means: str) -> None:
    """Refuse an option that must be a whole number of 1 or more, or None (`none_means`
    says what None does)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise OutboxConfigurationError(
            f"Relay {relay!r}: {option} must be a whole number of 1 or more, or None for "
            f"{none_means}; got {value!r}."
        )


class Relay:
    """Base class of the relays: forward each message of the categories it is connected
    to. A subclass implements `publish`; `check` may add its own configuration errors.

    `name` names the relay in the admin and the logs (each relay's calls are recorded
    on a message under it, so a retry does not publish again what it already did): it
    must be unique in the project and stay the same across deploys.
    """

    # The pip extra that installs this relay's client library, for error messages.
    extra: ClassVar[str] = ""

    def __init__(
        self, name: str, *, envelope: Envelope | str = "cloudevents", max_batch: int = 1000
    ) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise OutboxConfigurationError(
                f"A relay's name must be 1 to 100 letters, digits, '.', '_' or '-', "
                f"starting with a letter or digit; got {name!r}."
            )
        self.name = name
        self.envelope = envelope_named(envelope) if isinstance(envelope, str) else envelope
        # The receiver's id the engine records deliveries under (`module.qualname`).
        self.__qualname__ = f"{type(self).__qualname__}[{name}]"
        self.__module__ = type(self).__module__
        self._connected: list[tuple[Any, OutboxCategory]] = []
        # Calls made at once by the drain's slot threads go out as one publish.
        self._batcher = Batcher(self.publish, max_batch)

    # -- declaring --------------------------------------------------------------------

    def connect(
        self,
        *targets: OutboxCategory | OutboxScope,
        signals: Iterable[Any] = (process_region_outbox, process_control_outbox),
    ) -> Relay:
        """Forward the messages of these categories (a scope stands for all of its
        categories), from the region and control outboxes unless `signals` says which.
        Returns the relay, so it can be declared in one expression."""
        if not targets:
            raise OutboxConfigurationError(
                f"Relay {self.name!r}: connect() needs at least one category or scope."
            )
        known = relays.get(self.name)
        if known is not None and known is not self:
            raise OutboxConfigurationError(
                f"Two relays are named {self.name!r} ({known!r} and {self!r}); each "
                f"relay's name must be unique, since deliveries are recorded under it."
            )
        categories = _categories(targets, self.name)  # refused before the name is taken
        relays[self.name] = self
        for category in categories:
            for signal in signals:
                # weak=False: the relay lives as long as its connection, referenced or not
                signal.connect(
                    self, sender=category, weak=False, dispatch_uid=(self.name, category)
                )
                self._connected.append((signal, category))
        return self

    def disconnect(self) -> None:
        """Stop forwarding (tests, or a relay replaced at runtime)."""
        for signal, category in self._connected:
            signal.disconnect(self, sender=category, dispatch_uid=(self.name, category))
        self._connected.clear()
        if relays.get(self.name) is self:
            del relays[self.name]
        self.close()

    @property
    def categories(self) -> frozenset[OutboxCategory]:
        return frozenset(category for _, category in self._connected)

    # -- delivering -------------------------------------------------------------------

    def __call__(self, signal: Any = None, sender: Any = None, **kwargs: Any) -> None:
        """The receiver the process signals call: publish the message (with those of
        other shards' calls made meanwhile, `outbox.relays.batching`), raise what its
        publish failed with (the engine then retries, delays or dead-letters it)."""
        failure = self._batcher.send(Message.from_receiver(sender, kwargs))
        if failure is not None:
            raise failure

    def publish(self, messages: Sequence[Message]) -> Failures:
        """Publish `messages` (in shard order: a shard's messages in the order given)
        and wait until the other side has them (a publisher confirm, a flush, a 2xx).
        Return what failed, by message id; a message not in the result was delivered.
        After a shard's first failure, publish none of that shard's later messages:
        report them failed too, so the shard keeps its order when it is retried.

        Raise `outbox.RetryLater` (as a failure) to ask for a delay, and
        `outbox.PermanentFailure` for a message that can never be published.
        """
        raise NotImplementedError

    def check(self) -> list[CheckMessage]:
        """Configuration errors of this relay, for the system checks (outbox.E023)."""
        return []

    def close(self) -> None:
        """Release connections (called on disconnect)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def error(self, text: str) -> Error:
        """A system-check error about this relay."""
        return Error(f"Relay {self.name!r}: {text}", obj=self, id="outbox.E023")


def _categories(targets: Iterable[Any], name: str) -> list[OutboxCategory]:
    found: list[OutboxCategory] = []
    for target in targets:
        if isinstance(target, OutboxScope):
            found.extend(sorted(target.categories))
        elif isinstance(target, OutboxCategory):
            found.append(target)
        else:
            raise OutboxConfigurationError(
                f"Relay {name!r}: connect() takes categories and scopes (OutboxCategory "
                f"or OutboxScope members), not {target!r} ({type(target).__name__})."
            )
    return list(dict.fromkeys(found))


def held_back(earlier: BaseException, message: Message) -> BaseException:
    """The failure reported for a message not published because an earlier message of
    its shard failed: the same error, except that one message's permanent failure is
    not its followers' (they are retried, not dead-lettered)."""
    if isinstance(earlier, PermanentFailure):
        return RuntimeError(
            f"not published: an earlier message of shard {message.shard_key} failed "
            f"permanently ({earlier})"
        )
    return earlier


def failed_in_shard_order(
    messages: Sequence[Message], outcome: Callable[[Message], BaseException | None]
) -> dict[uuid.UUID, BaseException]:
    """What failed, by message id: `outcome` of each message in order (its failure, or
    None), until a shard's first failure; that shard's later messages are not asked
    about and fail with it (`held_back`), so the shard is retried from there in order."""
    failed: dict[uuid.UUID, BaseException] = {}
    broken: dict[str, BaseException] = {}
    for message in messages:
        earlier = broken.get(message.shard_key)
        if earlier is not None:
            failed[message.message_id] = held_back(earlier, message)
            continue
        error = outcome(message)
        if error is not None:
            failed[message.message_id] = broken[message.shard_key] = error
    return failed


def skip_after_failure(
    messages: Sequence[Message], send: Callable[[Message], None]
) -> dict[uuid.UUID, BaseException]:
    """Call `send` for each message, in order; after a shard's first failure, send none
    of its later messages and report them failed with that error. The loop relays use
    when they publish one message at a time."""

    def sent(message: Message) -> BaseException | None:
        try:
            send(message)
        except Exception as error:
            return error
        return None

    return failed_in_shard_order(messages, sent)


class FunctionRelay(Relay):
    """A relay whose `publish` is a function of the project's (`batch_receiver`)."""

    def __init__(self, name: str, function: Callable[[Sequence[Message]], Failures | None]) -> None:
        super().__init__(name)
        self.function = function

    def publish(self, messages: Sequence[Message]) -> Failures:
        return self.function(messages) or {}


def batch_receiver(
    *targets: OutboxCategory | OutboxScope,
    name: str | None = None,
    signals: Iterable[Any] = (process_region_outbox, process_control_outbox),
) -> Callable[[Callable[[Sequence[Message]], Failures | None]], FunctionRelay]:
    """Connect a function that takes many messages at once, as a relay does::

        @batch_receiver(Category.ORGANIZATION_UPDATE)
        def index(messages: Sequence[Message]) -> dict[UUID, Exception] | None:
            ...  # one bulk request; return the failures by message id (None: all done)

    It gets the messages that the drain's slot threads deliver at the same time, at
    most one per shard, and the `Relay.publish` rules apply. `name` (default: the
    function's module and name) records its deliveries; keep it stable.
    """

    def connect(function: Callable[[Sequence[Message]], Failures | None]) -> FunctionRelay:
        label = name or f"{function.__module__}.{function.__qualname__}"
        return FunctionRelay(label, function).connect(*targets, signals=signals)  # type: ignore[return-value]

    return connect


__all__ += [
    "CloudEvents",
    "Envelope",
    "Failures",
    "FunctionRelay",
    "RelayClientMissing",
    "batch_receiver",
    "held_back",
    "skip_after_failure",
]
