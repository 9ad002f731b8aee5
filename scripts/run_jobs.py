"""Run named shell commands side by side, at most `--width` at a time, each one's output
kept in a file and printed whole when it ends (so parallel logs never interleave).

    python3 scripts/run_jobs.py --width 3 "sqlite=pytest ..." "postgres=pytest ..."

Jobs start in the order given: put the longest first. The exit status is 0 when every job
passed, else 1; the closing table names each job with its time and status. Ctrl-C or
SIGTERM ends every job still running (each runs in a process group of its own).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class Job:
    name: str
    command: str
    log: Path
    started: float = 0.0
    seconds: float = 0.0
    status: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    output: IO[bytes] | None = field(default=None, repr=False)


def parse(specs: list[str], log_dir: Path) -> list[Job]:
    jobs = []
    for spec in specs:
        name, sep, command = spec.partition("=")
        if not sep or not name or not command.strip():
            sys.exit(f"run_jobs: {spec!r} is not NAME=COMMAND")
        if any(job.name == name for job in jobs):
            sys.exit(f"run_jobs: two jobs are named {name!r}")
        jobs.append(Job(name, command, log_dir / f"{name}.log"))
    return jobs


def start(job: Job) -> None:
    job.output = job.log.open("wb")
    job.started = time.monotonic()
    job.process = subprocess.Popen(
        ["bash", "-c", job.command],
        stdout=job.output,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own, to end it whole
    )
    print(f"--- started {job.name}", flush=True)


def finish(job: Job, status: int) -> None:
    job.status = status
    job.seconds = time.monotonic() - job.started
    assert job.output is not None
    job.output.close()
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    print(f"=== {job.name}: {verdict} in {clock(job.seconds)}", flush=True)
    sys.stdout.buffer.write(job.log.read_bytes())
    sys.stdout.flush()


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def end_all(jobs: list[Job]) -> None:
    for job in jobs:
        if job.process is not None and job.status is None and job.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(job.process.pid, signal.SIGTERM)


def run(jobs: list[Job], width: int) -> int:
    waiting = list(jobs)
    running: list[Job] = []
    began = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < width:
                job = waiting.pop(0)
                start(job)
                running.append(job)
            time.sleep(0.2)
            for job in list(running):
                assert job.process is not None
                status = job.process.poll()
                if status is not None:
                    running.remove(job)
                    finish(job, status)
    except BaseException:
        end_all(jobs)
        raise
    print(f"=== side by side, {width} at a time, {clock(time.monotonic() - began)} in all:")
    for job in jobs:
        verdict = "ok" if job.status == 0 else "FAILED"
        print(f"    {job.name:<28} {clock(job.seconds):>6}  {verdict}")
    return 0 if all(job.status == 0 for job in jobs) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2, help="jobs at a time (default 2)")
    parser.add_argument("--log-dir", type=Path, help="where each job's output is kept")
    parser.add_argument("jobs", nargs="+", metavar="NAME=COMMAND")
    args = parser.parse_args()
    if args.width < 1:
        parser.error("--width must be at least 1")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="side-by-side-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    return run(parse(args.jobs, log_dir), args.width)


if __name__ == "__main__":
    sys.exit(main())
