import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        from tests.testapp.receivers import recorder

        # Worker processes started by tests (tests/workers.py) journal every receiver
        # call to the Delivery table, optionally slowed down.
        if os.environ.get("OUTBOX_TEST_JOURNAL"):
            recorder.journal = True
            recorder.delay = float(os.environ.get("OUTBOX_TEST_RECEIVER_DELAY", "0"))
        # AUDIT_EVENT goes to an `async def` receiver only: its shards are awaited.
        if os.environ.get("OUTBOX_TEST_ASYNC_AUDIT"):
            from outbox.signals import process_region_outbox
            from tests.testapp.categories import Category
            from tests.testapp.receivers import record, record_async

            process_region_outbox.disconnect(record, sender=Category.AUDIT_EVENT)
            process_region_outbox.connect(record_async, sender=Category.AUDIT_EVENT, weak=False)
