"""The retry policy: what a receiver's failure means for its message.

One `RetryPolicy` decides, for every failed delivery, whether the failure is final (the
message becomes a dead letter and its shard goes on) and, if not, how long each failed
row waits before it is tried again (its shard waits as long as its head row). The engine
asks it and records the answer; logging and signals stay in the engine.

The stock policy is today's behaviour: a capped exponential back-off with jitter
(``OUTBOX_BACKOFF_BASE_SECONDS``, doubled per failed attempt up to
``OUTBOX_BACKOFF_MAX_SECONDS``), dead after ``OUTBOX_MAX_ATTEMPTS`` failed attempts or a
category's own `OutboxCategory.max_attempts`, dead at once on `PermanentFailure`, never
dead on `NoReceiver`, and the delay a `RetryLater` asked for. A project replaces it by
naming a subclass in ``OUTBOX_RETRY_POLICY``, or for one category by returning a policy
from `OutboxCategory.retry_policy`. Each method decides one thing, so a subclass
overrides only what it changes::

    class QuickRetries(RetryPolicy):
        def delay(self, attempt: int) -> float:
            return 5.0  # every retry five seconds after the failure

        def max_attempts(self, category: int) -> int:
            return 2  # dead letter after the second failed attempt
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from django.utils.module_loading import import_string

from outbox.categories import OutboxCategory, registry
from outbox.conf import outbox_settings
from outbox.exceptions import NoReceiver, OutboxConfigurationError, PermanentFailure, RetryLater

__all__ = ["Failure", "RetryPolicy", "default_policy", "load_policy", "policy_for"]


@dataclass(frozen=True)
class Failure:
    """One failed delivery of a coalescing group, as a policy sees it.

    `attempts` holds each pending row's failed attempts before this one, the group's head
    row (its oldest) first; `errors` what each failing receiver raised (one entry when
    the group failed as a whole).
    """

    category: int
    attempts: Sequence[int]
    errors: Sequence[Exception]

    @property
    def attempt(self) -> int:
        """The number of the attempt that just failed, counted on the head row."""
        return self.attempts[0] + 1


class RetryPolicy:
    """Decides how failed deliveries are retried. Subclass it to change one decision."""

    def max_attempts(self, category: int) -> int:
        """Failed attempts after which a message of `category` is a dead letter; 0 never
        gives up. The category's own `max_attempts()` if it sets one, else
        ``OUTBOX_MAX_ATTEMPTS``."""
        member = registry.categories.get(category)
        own = member.max_attempts() if member is not None else None
        return outbox_settings.MAX_ATTEMPTS if own is None else own

    def ceiling(self, attempt: int) -> float:
        """The longest delay after `attempt` failed attempts: ``OUTBOX_BACKOFF_BASE_SECONDS``
        doubled per attempt after the first, capped at ``OUTBOX_BACKOFF_MAX_SECONDS``."""
        base = outbox_settings.BACKOFF_BASE_SECONDS
        cap = outbox_settings.BACKOFF_MAX_SECONDS
        return min(cap, base * 2.0 ** min(max(attempt, 1) - 1, 62))

    def delay(self, attempt: int) -> float:
        """Seconds a row waits after its `attempt`-th failed attempt: drawn between half
        the `ceiling` and the ceiling, so shards that failed together do not retry in
        step."""
        ceiling = self.ceiling(attempt)
        return random.uniform(ceiling / 2, ceiling)

    def asked_delay(self, error: RetryLater) -> float:
        """The delay a receiver asked for with `RetryLater`: at least a second, so a
        receiver asking for 0 does not spin its shard in a tight loop."""
        return max(error.delay_seconds, 1.0)

    def is_final(self, failure: Failure) -> bool:
        """Whether the message becomes a dead letter now: at once on a `PermanentFailure`,
        never while a receiver is missing (`NoReceiver`: the message waits for one to be
        connected), else once `max_attempts` is reached."""
        if any(isinstance(error, PermanentFailure) for error in failure.errors):
            return True
        if any(isinstance(error, NoReceiver) for error in failure.errors):
            return False
        limit = self.max_attempts(failure.category)
        return limit > 0 and failure.attempt >= limit

    def row_delays(self, failure: Failure) -> list[float]:
        """Each row's delay, in the order of `failure.attempts`; the first (the head
        row's) is how long the shard backs off.

        When every failing receiver raised `RetryLater`, all rows wait the longest delay
        asked. Otherwise each row waits its own `delay`, capped at the head row's so the
        whole group is due when its shard may retry; the head waits its own delay or the
        longest asked, whichever is longer.
        """
        asked = [self.asked_delay(e) for e in failure.errors if isinstance(e, RetryLater)]
        if asked and len(asked) == len(failure.errors):
            return [max(asked)] * len(failure.attempts)
        own = [self.delay(attempts + 1) for attempts in failure.attempts]
        head = max([own[0], *asked])
        return [head, *(min(delay, head) for delay in own[1:])]


def load_policy(path: str) -> type[RetryPolicy]:
    """The `RetryPolicy` subclass at dotted `path`; OutboxConfigurationError when it does
    not import or is no such subclass."""
    try:
        found = import_string(path)
    except ImportError as error:
        raise OutboxConfigurationError(
            f"OUTBOX_RETRY_POLICY = {path!r} cannot be imported ({error})."
        ) from error
    if not (isinstance(found, type) and issubclass(found, RetryPolicy)):
        raise OutboxConfigurationError(
            f"OUTBOX_RETRY_POLICY = {path!r} is not a subclass of outbox.retry.RetryPolicy."
        )
    return found


def default_policy() -> RetryPolicy:
    """The policy ``OUTBOX_RETRY_POLICY`` names, for categories without their own."""
    return load_policy(outbox_settings.RETRY_POLICY)()


def declared_policy(category: OutboxCategory) -> RetryPolicy | None:
    """The policy a category declares (`OutboxCategory.retry_policy`, a class or an
    instance), or None when it follows ``OUTBOX_RETRY_POLICY``."""
    own = category.retry_policy()
    if own is None or isinstance(own, RetryPolicy):
        return own
    if isinstance(own, type) and issubclass(own, RetryPolicy):
        return own()
    cls = type(category)
    raise OutboxConfigurationError(
        f"{cls.__module__}.{cls.__qualname__}.{category.name}.retry_policy() returned "
        f"{own!r}, not a RetryPolicy subclass or instance (or None)."
    )


def policy_for(category: int) -> RetryPolicy:
    """The policy that judges failures of `category`: its own, else the default."""
    member = registry.categories.get(category)
    own = declared_policy(member) if member is not None else None
    return default_policy() if own is None else own
