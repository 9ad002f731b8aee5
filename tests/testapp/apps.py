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
