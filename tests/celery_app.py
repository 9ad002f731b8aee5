"""The Celery app that the Celery tests run workers and beat with (tests/workers.py)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

from celery import Celery

from outbox.integrations.celery import add_beat_schedule

app = Celery("outbox_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
add_beat_schedule(app)
