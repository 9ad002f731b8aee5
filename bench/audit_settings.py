"""Settings of `python -m bench.audit`: the bench settings plus the admin and what it needs
(auth, sessions, messages), on a database of its own (`outbox_bench_audit`)."""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES, INSTALLED_APPS

AUDIT_DB = os.environ.get("OUTBOX_BENCH_AUDIT_DB", "outbox_bench_audit")

INSTALLED_APPS = [
    *(app for app in INSTALLED_APPS if not app.startswith("django.contrib.")),
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
]
DATABASES = {"default": {**DATABASES["default"], "NAME": AUDIT_DB}}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "bench.audit_urls"
ALLOWED_HOSTS = ["testserver"]
