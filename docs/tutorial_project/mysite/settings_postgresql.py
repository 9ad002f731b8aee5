"""The tutorial's settings on PostgreSQL (the page's "On PostgreSQL"): the same project,
another database. tests/test_tutorial.py runs the whole tutorial with it on the
PostgreSQL leg (DJANGO_SETTINGS_MODULE=mysite.settings_postgresql)."""

import os

from mysite.settings import *  # noqa: F403

# [databases]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "mysite",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": "127.0.0.1",
        "PORT": "5432",
    }
}
# [/databases]

# The test suite's server and a database of its own run (tests/test_tutorial.py).
for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT"):
    DATABASES["default"][key] = os.environ.get(f"TUTORIAL_DB_{key}", DATABASES["default"][key])
