"""Reading a window with Python's cyclic garbage collector paused.

A window of a few thousand rows builds tens of thousands of small objects (row tuples,
groups, messages) that all stay alive until the window is delivered. Building them
with the collector on makes it run again and again over objects that cannot be garbage,
and promotes them until a full collection walks every object of the process (all of
Django's, in a worker): measured on ordered streams, about a third of the drain's time.
None of these objects form cycles, so reference counting frees them when the window is
done; nothing is left for the collector to find.

The pause covers the engine's own reading only, never a receiver. It nests across
threads (a synchronous flush in one thread while a drain reads in another) and leaves
the collector alone when the process turned it off itself.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_readers = 0
_paused_by_us = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the block runs (see the module doc)."""
    global _readers, _paused_by_us
    with _lock:
        if _readers == 0:
            _paused_by_us = gc.isenabled()
            if _paused_by_us:
                gc.disable()
        _readers += 1
    try:
        yield
    finally:
        with _lock:
            _readers -= 1
            if _readers == 0 and _paused_by_us:
                _paused_by_us = False
                gc.enable()
