"""The sustained section's drain: one `python -m django drain_outboxes --loop` process
with the bench settings and the receiver probe (`bench.sustained_settings`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class DrainProcess:
    """`python -m django drain_outboxes --loop` with the bench settings and the probe."""

    READY_TIMEOUT_S = 60.0
    STOP_TIMEOUT_S = 45.0

    def __init__(self, folder: Path) -> None:
        self.log = folder / "receiver-starts.log"
        self.output = folder / "drain.out"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.sustained_settings",
            "OUTBOX_BENCH_SUSTAINED_LOG": str(self.log),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        command = [sys.executable, "-m", "django", "drain_outboxes", "--loop"]
        with open(self.output, "wb") as output:
            self.process = subprocess.Popen(
                [*command, "--progress-every", "0"],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        ready = Path(str(self.log) + ".ready")
        deadline = time.monotonic() + self.READY_TIMEOUT_S
        while not ready.exists():
            if not self.alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sustained: the drain did not start: {self.tail()}")
            time.sleep(0.05)
        time.sleep(0.5)  # past Django's setup: let it reach its first poll

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (a graceful stop), then SIGKILL if it hangs; its exit status."""
        if self.process is None:
            return None
        return stop_gracefully(self.process, self.STOP_TIMEOUT_S)

    def tail(self, lines: int = 20) -> str:
        return tail_of(self.output, lines)

    def starts(self) -> tuple[dict[int, float], int]:
        """Each message's first receiver start, and how many starts were repeats."""
        return first_starts(self.log)


def stop_gracefully(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM (a graceful stop), then SIGKILL if it hangs; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10.0)
    return process.returncode


def tail_of(path: Path, lines: int = 20) -> str:
    """The last lines of a process's output file."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def first_starts(path: Path) -> tuple[dict[int, float], int]:
    """From a probe's log of receiver starts: each message's first start, and how many
    starts were repeats."""
    starts: dict[int, float] = {}
    repeats = 0
    if not path.exists():
        return starts, repeats
    for line in path.read_text(encoding="ascii").splitlines():
        message, _, at = line.partition(" ")
        if not at:
            continue  # a line cut short by a kill
        if int(message) in starts:
            repeats += 1
        else:
            starts[int(message)] = float(at)
    return starts, repeats
