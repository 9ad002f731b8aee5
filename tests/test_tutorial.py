"""The tutorial of the docs site, run as the page shows it.

docs/tutorial.md includes the files of docs/tutorial_project/ and the commands of its
tutorial.sh; this test copies that project, runs tutorial.sh in a subprocess against a
fresh SQLite database, and checks what the page says happens, down to the tutorial's own
tests passing under pytest (the plugin found through its entry point) and Django's runner.
scripts/wheel_check.sh runs the same script against the built wheel alone.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "docs" / "tutorial_project"


def run_tutorial(tmp_path, **extra_env):
    project = tmp_path / "tutorial_project"
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__", "*.sqlite3"))
    # `python` in the script is this interpreter, with this checkout's outbox importable.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a wrapper, not a symlink: a venv needs its own path
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"} and not key.startswith("OUTBOX_")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        PYTHONDONTWRITEBYTECODE="1",
        **extra_env,
    )
    return subprocess.run(
        ["bash", "tutorial.sh"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(
    os.environ.get("OUTBOX_TEST_DB", "sqlite") != "sqlite",
    reason="the tutorial runs its own SQLite project: once, on the SQLite leg, is enough",
)
def test_the_tutorial_runs_as_documented(tmp_path):
    done = run_tutorial(tmp_path)
    assert_ran_as_documented(done)
    assert done.stdout.count("    vacuum: not available on SQLite (PostgreSQL only)") == 2


@pytest.mark.skipif(
    os.environ.get("OUTBOX_TEST_DB") != "postgres",
    reason="the page's 'On PostgreSQL': once, on the PostgreSQL leg",
)
def test_the_tutorial_runs_on_postgresql(tmp_path, tutorial_database):
    """The same commands with the page's PostgreSQL DATABASES print the same; migrate
    gave the outbox tables their NOTIFY trigger."""
    done = run_tutorial(
        tmp_path,
        DJANGO_SETTINGS_MODULE="mysite.settings_postgresql",
        **{f"TUTORIAL_DB_{key}": value for key, value in tutorial_database.items()},
    )
    assert_ran_as_documented(done)
    # The page's PostgreSQL sample of outbox_status: vacuum health in place of SQLite's
    # "not available".
    assert "    vacuum: outbox_regionoutbox: " in done.stdout
    assert "default: autovacuum " in done.stdout
    assert "    lease table outbox_shardlease: " in done.stdout
    assert "not available" not in done.stdout
    with _postgres(tutorial_database["NAME"], tutorial_database) as connection:
        triggers = connection.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname = 'outbox_notify'"
        ).fetchall()
    assert sorted(table for (table,) in triggers) == [
        "outbox_controloutbox",
        "outbox_regionoutbox",
    ]


@pytest.fixture
def tutorial_database():
    """A fresh database for the tutorial on the suite's PostgreSQL server, dropped after."""
    from django.conf import settings

    server = settings.DATABASES["default"]
    config = {key: str(server[key]) for key in ("USER", "PASSWORD", "HOST", "PORT")}
    config["NAME"] = "tutorial" + os.environ.get("OUTBOX_TEST_DB_SUFFIX", "")
    with _postgres("postgres", config) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}"')
        connection.execute(f'CREATE DATABASE "{config["NAME"]}"')
    yield config
    with _postgres("postgres", config) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{config["NAME"]}" WITH (FORCE)')


def _postgres(name, config):
    import psycopg

    return psycopg.connect(
        dbname=name,
        user=config["USER"],
        password=config["PASSWORD"],
        host=config["HOST"],
        port=config["PORT"],
        autocommit=True,
    )


def assert_ran_as_documented(done):
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    delivered = [line for line in lines if line.startswith("organization ")]
    # Step 7: flushed right after the commit. Step 8: two renames left to the drain,
    # coalesced into one receiver call with the newest name.
    assert delivered == [
        "organization 1 is now called 'Acme Corporation'",
        "organization 1 is now called 'Acme Ltd.'",
    ]
    status = next(line for line in lines if line.startswith("outbox.RegionOutbox"))
    assert "2 rows, 2 due" in status
    summary = next(line for line in lines if line.startswith("drain_outboxes:"))
    assert "receiver calls 1, rows retired 2 (1 coalesced), failures 0" in summary
    assert "Apply all migrations" in done.stdout
    assert "System check identified no issues" in done.stdout
    # Step 9: the tutorial's tests, under pytest (the plugin's fixtures and the TestCase)
    # and under Django's own runner, see the receiver's deliveries.
    assert "4 passed" in done.stdout
    assert "Ran 2 tests" in done.stderr
