"""Settings of the django-outboxes example project, read from the environment.

Two databases play two silos: "default" is one region's database, "control" the control
silo's. Both default to SQLite files under ``var/``, so the demo runs with no server::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/example_demo
    CONTROL_DATABASE_URL=postgres://postgres@127.0.0.1:5432/example_demo_control
"""

from pathlib import Path
from typing import Any

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-outbox-example-only")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "outbox",
    "accounts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database(var: str, sqlite_file: str) -> dict[str, Any]:
    """Read one database URL from the environment, with per-vendor options."""
    config: dict[str, Any] = env.db_url(var, default=f"sqlite:///{VAR_DIR / sqlite_file}")
    options = config.setdefault("OPTIONS", {})
    engine = config["ENGINE"]
    if engine.endswith("mysql"):
        # The outbox schedules rows with the database's NOW(): keep the session in UTC,
        # as Django stores datetimes in UTC.
        options.setdefault("init_command", "SET time_zone = '+00:00'")
        options.setdefault("charset", "utf8mb4")
    elif engine.endswith("sqlite3"):
        # WAL lets readers and the writer overlap; IMMEDIATE takes the write lock up front,
        # so a transaction never fails half-way when it upgrades from reading to writing.
        options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 20)
    return config


DATABASES = {
    "default": database("DATABASE_URL", "region.sqlite3"),
    "control": database("CONTROL_DATABASE_URL", "control.sqlite3"),
}
DATABASE_ROUTERS = ["example_project.routers.SiloRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Celery (example_project/celery.py): `celery -A example_project worker -B`.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="redis://127.0.0.1:6379/0")
# Drain tasks run for seconds: a worker process takes one at a time, so idle processes
# of other workers get the rest instead of waiting behind it.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# The demo publishes organization changes to RabbitMQ here, when it answers
# (accounts/demo/rabbitmq.py), to an exchange of this name; AMQP_URL= (empty): never.
AMQP_URL = env.str("AMQP_URL", default="amqp://guest:guest@127.0.0.1:5672//")
DEMO_AMQP_EXCHANGE = env.str("DEMO_AMQP_EXCHANGE", default="accounts-demo")
# Set to "outbox.integrations.celery.prompt_drain" to send a drain task on each commit
# that leaves rows to the drain, instead of waiting for the next beat tick.
OUTBOX_PROMPT_DRAIN = env.str("OUTBOX_PROMPT_DRAIN", default=None)
OUTBOX_CELERY_SCHEDULE_SECONDS = env.float("OUTBOX_CELERY_SCHEDULE_SECONDS", default=2.0)

# Short back-off, so the demo's failing receiver is retried within a second.
# Production values are seconds to minutes (the library defaults are 2s and 900s).
OUTBOX_BACKOFF_BASE_SECONDS = env.float("OUTBOX_BACKOFF_BASE_SECONDS", default=0.2)
OUTBOX_BACKOFF_MAX_SECONDS = env.float("OUTBOX_BACKOFF_MAX_SECONDS", default=1.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
}
