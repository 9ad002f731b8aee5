"""The relay leg's word from the relay to the journaling receiver, which the engine calls
next on the same thread (`stress/relay.py` is connected first): the message id whose
publish just failed. The journaling receiver then fails its call too, so the journal
shows the group's delivery failed, as the engine saw it."""

from __future__ import annotations

import threading
from typing import Any

_failed = threading.local()


def publish_failed(message_id: Any) -> None:
    """Said by the relay when its publish of this message failed."""
    _failed.message_id = message_id


def published(message_id: Any) -> bool:
    """False if the relay failed to publish this message just before, on this thread.
    Read once: the next call (a retry) starts afresh."""
    failed = getattr(_failed, "message_id", None)
    _failed.message_id = None
    return failed is None or str(failed) != str(message_id)
