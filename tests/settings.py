"""Settings of the test suite; OUTBOX_TEST_DB picks sqlite (default), postgres or mariadb."""

import os

SECRET_KEY = "outbox-tests"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox",
    "tests.testapp",
]

TEST_DB = os.environ.get("OUTBOX_TEST_DB", "sqlite")
# "postgres-portable" runs PostgreSQL through the portable path instead of the fast path.
OUTBOX_FAST_PATH = TEST_DB != "postgres-portable"
if TEST_DB == "postgres-portable":
    TEST_DB = "postgres"


def _database(name: str) -> dict:
    if TEST_DB == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{name}.sqlite3"}
    if TEST_DB == "postgres":
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    if TEST_DB == "mariadb":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            # Now() is the session clock: keep it in UTC, as Django stores datetimes.
            "OPTIONS": {"charset": "utf8mb4", "init_command": "SET time_zone = '+00:00'"},
        }
    raise RuntimeError(f"OUTBOX_TEST_DB={TEST_DB!r}: use sqlite, postgres or mariadb")


DATABASES = {"default": _database("outbox"), "control": _database("outbox_control")}
DATABASE_ROUTERS = ["tests.testapp.routers.ControlRouter"]

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
ROOT_URLCONF = "tests.urls"

# Short back-off so retry tests do not wait long; leases long enough for slow CI.
OUTBOX_BACKOFF_BASE_SECONDS = 30.0
OUTBOX_LEASE_SECONDS = 30.0
