"""The Celery app that the Celery tests run workers and beat with (tests/workers.py)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from celery import Celery

from outbox.integrations.celery import add_beat_schedule

app = Celery("outbox_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
add_beat_schedule(app)


@app.task(bind=True, name="tests.relayed")
def relayed(self, **kwargs):
    """What a CeleryTaskRelay sends (tests/test_relay_celery_tasks.py): each call
    appended as a JSON line to the file OUTBOX_TEST_RELAYED_FILE names."""
    import json

    record = {"task_id": self.request.id, "headers": self.request.headers, "kwargs": kwargs}
    with open(os.environ["OUTBOX_TEST_RELAYED_FILE"], "a") as out:
        out.write(json.dumps(record) + "\n")
