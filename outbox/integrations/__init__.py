"""Running the drain elsewhere: Celery (`outbox.integrations.celery`), Django's Tasks
framework (`outbox.integrations.django_tasks`), and the graceful stop they share with
`manage.py drain_outboxes` (`outbox.integrations.graceful`).

Importing this package imports neither Celery nor Django Tasks: each integration is its
own module, imported only by projects that use it.
"""
