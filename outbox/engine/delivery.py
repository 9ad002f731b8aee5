"""Calling the receivers of one coalescing group."""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from outbox.backends.base import Group
from outbox.categories import registry
from outbox.exceptions import NoReceiver, OutboxError
from outbox.models import OutboxBase
from outbox.signals import is_transactional


class LeaseLost(OutboxError):
    """Raised inside a transactional delivery to roll the receiver's writes back."""


def send(model: type[OutboxBase], group: Group, retire: Callable[[], bool], using: str) -> bool:
    """Call the group's receivers with its newest payload.

    Returns True when the group's rows were already deleted, inside the receivers'
    own transaction (transactional receivers); False when the caller must retire them.
    Raises whatever a receiver raised; a category with no receiver raises NoReceiver.
    """
    category = registry.category(group.category)
    signal = model.process_signal
    if not signal.has_listeners(category):
        raise NoReceiver(f"no receiver is connected for category {category.name}")
    assert group.message is not None
    kwargs = group.message.signal_kwargs()
    if not is_transactional(signal, category):
        signal.send(sender=category, **kwargs)
        return False
    with transaction.atomic(using=using):
        signal.send(sender=category, **kwargs)
        if not retire():
            raise LeaseLost(f"lease of shard {group.shard} was lost")
    return True
