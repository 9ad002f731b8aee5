"""Running the drain elsewhere: Celery (`outbox.integrations.celery`) and Django's Tasks
framework (`outbox.integrations.django_tasks`), planned by `outbox.integrations.dispatch`.
Both run `outbox.engine.DrainWorker`, like `manage.py drain_outboxes`.

Importing this package imports neither Celery nor Django Tasks: each integration is its
own module, imported only by projects that use it.
"""
