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
    _record(self, kwargs)


@app.task(bind=True, name="tests.not_relayed")
def not_relayed(self, **kwargs):
    """A task no relay names (tests/test_header_rule.py): a message a writer's headers
    steered here would show in the same file."""
    _record(self, kwargs)


def _record(task, kwargs):
    import json

    request = task.request
    record = {
        "task": task.name,
        "task_id": request.id,
        "headers": request.headers,
        "kwargs": kwargs,
    }
    with open(os.environ["OUTBOX_TEST_RELAYED_FILE"], "a") as out:
        out.write(json.dumps(record) + "\n")
