"""The example project's Celery app: `celery -A example_project worker -B` drains the
outboxes (beat fans due shards out to drain tasks; see outbox.integrations.celery).

Not imported by the project itself, so the demo runs without Celery installed.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

from celery import Celery

from outbox.integrations.celery import add_beat_schedule

app = Celery("example_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
add_beat_schedule(app)
