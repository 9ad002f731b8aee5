# Load the Celery app whenever Django starts, so that tasks sent from the web process
# (the prompt drain of OUTBOX_PROMPT_DRAIN) use its broker. Celery is optional here:
# the demo runs without it.
try:
    from example_project.celery import app as celery_app
except ImportError:
    pass
else:
    __all__ = ["celery_app"]
