"""Sections measured beside the drains, each in its own module.

A section module has:

- ``TITLE``: the heading of its part of the Markdown report;
- ``measure(mode: str, log: Callable[[str], None]) -> dict``: run it in the given mode
  ("smoke", "quick" or "full") and return JSON-ready results (stored under its name);
- ``markdown(result: dict) -> list[str]``: the report lines under its heading.

A section whose module is missing, or whose ``measure`` returns ``{"skipped": reason}``,
is reported as skipped instead of failing the run.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

MODULES = {
    "wakeup": "bench.wakeup",
    "sustained": "bench.sustained",
    "mariadb": "bench.mariadb",
    "waiting": "bench.waiting",
    "identity": "bench.identity_floor",
    "relays": "bench.relays",
    "cpu": "bench.cpu_per_message",
    "trickle": "bench.trickle",
}


def available() -> dict[str, ModuleType]:
    """The section modules present in this checkout, by section name."""
    found = {}
    for name, path in MODULES.items():
        if importlib.util.find_spec(path) is not None:
            found[name] = importlib.import_module(path)
    return found


def markdown(data: dict) -> list[str]:
    lines: list[str] = []
    for name, module in available().items():
        result = data.get(name)
        if result is None:
            continue
        lines += ["", f"## {module.TITLE}", ""]
        if "skipped" in result:
            lines.append(f"Skipped: {result['skipped']}")
        else:
            lines += module.markdown(result)
    return lines
