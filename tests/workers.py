"""Worker processes for tests: Celery workers, beat and `drain_outboxes`, run as real
subprocesses against the test databases pytest created."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.db import connections

ROOT = Path(__file__).resolve().parent.parent


def worker_env(receiver_delay: float = 0.0, **settings) -> dict[str, str]:
    """The environment of a worker process: the test databases, settings as JSON."""
    env = os.environ.copy()
    env["OUTBOX_TEST_DATABASE_NAMES"] = ",".join(
        f"{alias}={connections[alias].settings_dict['NAME']}" for alias in ("default", "control")
    )
    env["OUTBOX_TEST_SETTINGS"] = json.dumps(settings)
    env["OUTBOX_TEST_JOURNAL"] = "1"  # see tests/testapp/apps.py
    env["OUTBOX_TEST_RECEIVER_DELAY"] = str(receiver_delay)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Process:
    """A subprocess whose output goes to a log file the test can wait on."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.args = args
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.args} exited early:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not seen in {timeout}s:\n{self.output()}")
            time.sleep(0.05)

    def terminate(self, timeout: float = 60.0) -> float:
        """SIGTERM; return the seconds until the process exited."""
        sent = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        self.popen.wait(timeout)
        return time.monotonic() - sent

    def stop(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def wait_until(condition, timeout: float, interval: float = 0.1, message: str = "") -> float:
    """Poll `condition` until it holds; return the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(message or f"condition not met within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - started


def celery_worker(
    name: str, queue: str, tmp_path: Path, env: dict[str, str], *, beat=False, concurrency: int = 2
) -> Process:
    """A Celery worker on `queue`. Its node name carries this process's id: a worker's
    control queue is exclusive on the broker, so two test runs side by side must not
    start workers of one name."""
    args = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
        "-Q", queue, "-c", str(concurrency), "-n", f"{name}-{os.getpid()}@%h", "-P", "prefork",
        "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info",
    ]  # fmt: skip
    if beat:
        args += ["-B", "-s", str(tmp_path / f"{name}-beat-schedule")]
    process = Process(args, env, tmp_path / f"{name}.log")
    process.wait_for_output(" ready.")
    return process


def celery_beat(tmp_path: Path, env: dict[str, str]) -> Process:
    args = [
        sys.executable, "-m", "celery", "-A", "tests.celery_app", "beat",
        "-s", str(tmp_path / "beat-schedule"), "-l", "info",
    ]  # fmt: skip
    process = Process(args, env, tmp_path / "beat.log")
    process.wait_for_output("beat: Starting")
    return process
