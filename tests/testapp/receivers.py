"""Receivers of the test app: they record every call, and can be told to fail or wait."""

import asyncio
import os
import threading
import time

from django.dispatch import receiver

from outbox import transactional_receiver
from outbox.signals import process_control_outbox, process_region_outbox
from tests.testapp.categories import Category
from tests.testapp.models import Delivery, Ledger


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.failing: set[int] = set()  # shard identifiers whose receiver raises
        self.delay = 0.0
        self.journal = False  # also write each call to the Delivery table
        self.during_call = None  # callable run inside the receiver
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.__init__()

    def __call__(self, sender, **kwargs) -> None:
        started = time.monotonic()
        if self.during_call is not None:
            self.during_call(sender, kwargs)
        if self.delay:
            time.sleep(self.delay)
        if isinstance(kwargs.get("payload"), dict) and kwargs["payload"].get("hang"):
            time.sleep(kwargs["payload"]["hang"])  # a call that hangs, told by its message
        if kwargs["shard_identifier"] in self.failing:
            raise RuntimeError(f"receiver failed for shard {kwargs['shard_identifier']}")
        with self.lock:
            self.calls.append({"category": sender, **kwargs})
        if self.journal:
            Delivery.objects.create(
                category=sender,
                shard_identifier=kwargs["shard_identifier"],
                object_identifier=kwargs["object_identifier"],
                payload=kwargs["payload"],
                thread=threading.current_thread().name,
                process=os.getpid(),
                started=started,
                ended=time.monotonic(),
            )

    def payloads(self, category=None) -> list:
        return [c["payload"] for c in self.calls if category is None or c["category"] == category]


recorder = Recorder()


@receiver(process_region_outbox, sender=Category.ORGANIZATION_UPDATE)
@receiver(process_region_outbox, sender=Category.AUDIT_EVENT)
@receiver(process_control_outbox, sender=Category.USER_UPDATE)
def record(sender, **kwargs):
    recorder(sender, **kwargs)


@transactional_receiver(process_region_outbox, sender=Category.LEDGER_ENTRY)
def write_ledger(sender, object_identifier, **kwargs):
    Ledger.objects.create(entry=object_identifier)
    recorder(sender, object_identifier=object_identifier, **kwargs)


async def record_async(sender, **kwargs):
    """An `async def` receiver for worker processes (OUTBOX_TEST_ASYNC_AUDIT, see
    tests/testapp/apps.py): journals each call; a message's `hang` is awaited."""
    started = time.monotonic()
    payload = kwargs.get("payload")
    if isinstance(payload, dict) and payload.get("hang"):
        await asyncio.sleep(payload["hang"])
    await Delivery.objects.acreate(
        category=sender,
        shard_identifier=kwargs["shard_identifier"],
        object_identifier=kwargs["object_identifier"],
        payload=payload,
        thread=threading.current_thread().name,
        process=os.getpid(),
        started=started,
        ended=time.monotonic(),
    )
