"""The two sides of the CPU-per-message section (`bench.cpu_per_message`) and the process
each one runs in.

- The head: this working tree's `outbox`, run by the bench's own interpreter.
- The baseline: a commit checked out as a git worktree beside this tree
  (`../baseline-<commit>`), with a virtualenv of its own in it (`.venv`) holding that
  tree's `outbox` and the head's very Django and psycopg versions, so the two sides
  differ only in `outbox`. Both are made when missing, unless the caller says not to
  (smoke mode), and reused when present: a stamp in the virtualenv lists what pip
  installed.

Each side answers through `bench/cpu_driver.py`, run by its interpreter in a process of
its own, on a database of its own, with its tree alone on PYTHONPATH and the script's
folder kept off sys.path (PYTHONSAFEPATH), so it imports its own `outbox`; the driver
says which file that was, and it is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "cpu_driver.py"
STAMP = ".installed-bench-cpu"  # in the baseline's virtualenv: its pip requirements
PINNED = ("django", "psycopg", "psycopg-binary", "psycopg-c")


class Unavailable(Exception):
    """The baseline cannot run here; the message says why."""


@dataclass(frozen=True)
class Side:
    name: str  # "baseline" or "head"
    label: str  # what it runs, for the report
    tree: Path  # the checkout whose `outbox` it imports
    python: Path
    database: str


def head(database: str) -> Side:
    """This working tree, run by the bench's interpreter."""
    try:
        commit = _git(ROOT, "rev-parse", "--short", "HEAD")
        dirty = bool(_git(ROOT, "status", "--porcelain", "--untracked-files=no"))
        label = f"head ({commit}{' + working tree' if dirty else ''})"
    except Unavailable:  # not a git checkout: still a head to measure
        label = "head"
    return Side("head", label, ROOT, Path(sys.executable), database)


def baseline(commit: str, database: str, build: bool, log: Any) -> Side:
    """The commit's worktree and virtualenv, made (or brought up to the head's pins)
    when `build` allows; raises Unavailable when they are missing and it does not."""
    full = _git(ROOT, "rev-parse", "--verify", f"{commit}^{{commit}}")
    tree = ROOT.parent / f"baseline-{full[:7]}"
    python = tree / ".venv" / "bin" / "python"
    stamp = tree / ".venv" / STAMP
    if not stamp.exists() and not build:
        raise Unavailable(f"no virtualenv at {python.parent.parent}; smoke mode does not build it")
    if build:
        _ensure_worktree(tree, full, log)
        _ensure_venv(tree, _requirements(tree), log)
    elif _git(tree, "rev-parse", "HEAD") != full:
        raise Unavailable(f"{tree} is not at {full[:7]}")
    return Side("baseline", full[:7], tree, python, database)


def _ensure_worktree(tree: Path, full: str, log: Any) -> None:
    if not tree.exists():
        log(f"cpu: git worktree add {tree} {full[:7]}")
        _git(ROOT, "worktree", "add", "--detach", str(tree), full)
    if _git(tree, "rev-parse", "HEAD") != full:
        raise Unavailable(f"{tree} exists but is not at {full[:7]}")


def _ensure_venv(tree: Path, requirements: list[str], log: Any) -> None:
    """The worktree's virtualenv with its `outbox` (editable) and `requirements`."""
    venv = tree / ".venv"
    stamp = venv / STAMP
    wanted = "\n".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted:
        return
    log(f"cpu: installing the baseline into {venv} ({', '.join(requirements[1:])})")
    if not (venv / "bin" / "python").exists():
        # The bench's own interpreter makes it, so both sides run the same Python.
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "install", "--quiet", "-e", *requirements], capture_output=True, text=True
    )
    if done.returncode:
        raise Unavailable(f"pip failed: {done.stderr.strip()[-500:]}")
    stamp.write_text(wanted)


def _requirements(tree: Path) -> list[str]:
    """The baseline's: its tree with the PostgreSQL extra, and the Django and psycopg
    distributions of the head's interpreter at their versions there."""
    requirements = [f"{tree}[postgres]"]
    for distribution in PINNED:
        try:
            requirements.append(f"{distribution}=={metadata.version(distribution)}")
        except metadata.PackageNotFoundError:
            continue
    return requirements


def _git(where: Path, *arguments: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(where), *arguments], capture_output=True, text=True)
    except OSError as exc:
        raise Unavailable(f"git: {exc}") from exc
    if done.returncode:
        raise Unavailable(f"git {' '.join(arguments)}: {done.stderr.strip()}")
    return done.stdout.strip()


class Driver:
    """A side's `bench/cpu_driver.py` process: `ask` sends it a command and returns its
    answer; `hello` is what it said at start."""

    def __init__(self, side: Side) -> None:
        self.side = side
        env = {**os.environ, "PYTHONPATH": str(side.tree), "PYTHONSAFEPATH": "1"}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the driver configures Django itself
        self.process = subprocess.Popen(
            [str(side.python), str(DRIVER), side.database],
            cwd=side.tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,  # its stderr is the bench's: a traceback shows in the run's log
        )
        self.hello = self._answer()
        imported = Path(self.hello["outbox_file"]).resolve()
        if not imported.is_relative_to(side.tree.resolve()):
            self.close()
            raise RuntimeError(f"the {side.name} side imported {imported}, not its own outbox")

    def ask(self, op: str, **arguments: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            status = self.process.wait()
            raise RuntimeError(f"the {self.side.name} side's driver exited ({status}), see its log")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Driver:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
