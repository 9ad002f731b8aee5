"""Turn measurements into the results files: JSON, a Markdown table and a PNG chart.

Headline keys (all for the ordered-streams shape unless named otherwise) are flat at the
top of the JSON so that scripts and CI can read them without knowing the layout.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HEADLINE_SHAPE = "ordered_streams"
CONTENDER_KEYS = {
    "raw_limit": "raw_limit_per_s",
    "raw_leased": "raw_leased_per_s",
    "drain_1p": "drain_1p_per_s",
    "drain_2p": "drain_2p_per_s",
    "procrastinate": "procrastinate_per_s",
    "procrastinate_lock": "procrastinate_lock_per_s",
    "domain_events": "domain_events_per_s",
    "reliable_outbox": "reliable_outbox_per_s",
    "reference": "reference_per_s",
}
RATIOS = {  # name: (numerator, denominator, column header)
    "drain_1p_over_raw_limit": ("drain_1p", "raw_limit", "1p ÷ raw"),
    "drain_1p_over_raw_leased": ("drain_1p", "raw_leased", "1p ÷ leased floor"),
    "raw_leased_over_raw_limit": ("raw_leased", "raw_limit", "leased floor ÷ raw"),
    "drain_1p_over_procrastinate": ("drain_1p", "procrastinate", "1p ÷ procrastinate"),
    "drain_1p_over_procrastinate_lock": (
        "drain_1p",
        "procrastinate_lock",
        "1p ÷ procrastinate lock",
    ),
    "drain_1p_over_domain_events": ("drain_1p", "domain_events", "1p ÷ domain-events"),
    "drain_1p_over_reliable_outbox": ("drain_1p", "reliable_outbox", "1p ÷ reliable-outbox"),
    "drain_1p_over_reference": ("drain_1p", "reference", "1p ÷ reference"),
    "drain_2p_over_drain_1p": ("drain_2p", "drain_1p", "2p ÷ 1p"),
}
COLUMNS = [
    ("raw_limit", "raw SQL limit"),
    ("raw_leased", "raw + lease floor"),
    ("drain_1p", "outboxes 1p"),
    ("drain_2p", "outboxes 2p"),
    ("procrastinate", "procrastinate"),
    ("procrastinate_lock", "procrastinate lock=shard"),
    ("domain_events", "django-domain-events"),
    ("reliable_outbox", "django-reliable-outbox"),
    ("reference", "reference design"),
]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def header(mode: str, batch_rows: int, batch_shards: int, budget: float) -> dict[str, Any]:
    """What was run, on what: versions, sizes, machine. Filled in before measuring."""
    from django.db import connection

    from outbox.backends import get_backend

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server_version = cursor.fetchone()[0]
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "mode": mode,
        "batch_rows": batch_rows,
        "batch_shards": batch_shards,
        "drain_budget_seconds": budget,
        "receiver": os.environ.get("OUTBOX_BENCH_RECEIVER", "count"),
        "versions": {
            "python": platform.python_version(),
            "django": _version("django"),
            "psycopg": _version("psycopg"),
            "postgresql": server_version,
            "django_outboxes": _version("django-outboxes"),
            "procrastinate": _version("procrastinate"),
            "outbox_backend": type(get_backend("default")).__name__,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": list(os.getloadavg()),
            "platform": platform.platform(),
        },
    }


def _rate(shape: dict[str, Any] | None, contender: str) -> float | None:
    if not shape or contender not in shape["contenders"]:
        return None
    return float(shape["contenders"][contender]["per_s"])


def _ratios(shape: dict[str, Any]) -> dict[str, float | None]:
    ratios: dict[str, float | None] = {}
    for name, (top, bottom, _) in RATIOS.items():
        numerator, denominator = _rate(shape, top), _rate(shape, bottom)
        ratios[name] = numerator / denominator if numerator and denominator else None
    return ratios


def incomplete(data: dict[str, Any]) -> list[str]:
    """Smoke mode must finish every drain: anything stopped at its budget is a problem."""
    problems = []
    for name, shape in data.get("shapes", {}).items():
        for contender, result in shape["contenders"].items():
            if not result["complete"]:
                problems.append(f"{name}/{contender}: did not finish within its budget")
    for step in data.get("scale", {}).get("steps", []):
        if not step["complete"]:
            problems.append(f"scale {step['backlog_rows']}: did not finish within its budget")
    return problems


def summarize(data: dict[str, Any]) -> None:
    """Add per-shape ratios and the flat headline keys."""
    shapes = data.get("shapes", {})
    for shape in shapes.values():
        shape["ratios"] = _ratios(shape)
    headline = shapes.get(HEADLINE_SHAPE)
    for contender, key in CONTENDER_KEYS.items():
        data[key] = _rate(headline, contender)
    data["ratios"] = headline["ratios"] if headline else {}
    data["write_overhead_ratio"] = data.get("write_overhead", {}).get("ratio")
    data["write_overhead_deferred_ratio"] = data.get("write_overhead", {}).get("deferred_ratio")
    data["scale_1m_over_10k_ratio"] = data.get("scale", {}).get("ratio")
    data["sync_flush_p50_ms"] = data.get("sync_flush", {}).get("p50_ms")
    data["sync_flush_p99_ms"] = data.get("sync_flush", {}).get("p99_ms")
    data["sync_flush_p50_over_floor"] = data.get("sync_flush", {}).get("p50_over_floor")
    coalescing = shapes.get("heavy_coalescing")
    if coalescing and "drain_1p" in coalescing["contenders"]:
        drain = coalescing["contenders"]["drain_1p"]
        reference = coalescing["contenders"].get("reference")
        data["coalescing"] = {
            "updates": coalescing["shape"]["rows"],
            "objects": coalescing["shape"]["coalescing_groups"],
            "rows_retired": drain["rows_retired"],
            "receiver_calls": drain["receiver_calls"],
            "seconds": drain["seconds"],
            "complete": drain["complete"],
            "reference_receiver_calls": reference["receiver_calls"] if reference else None,
        }
    data["rows"] = {name: shape["shape"]["rows"] for name, shape in shapes.items()}
    data["load_average_at_end"] = list(os.getloadavg())


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _cell(shape: dict[str, Any], contender: str) -> str:
    result = shape["contenders"].get(contender)
    if result is None:
        return "-"
    return _fmt(result["per_s"]) + ("" if result["complete"] else "*")


def _drain_lines(shapes: dict[str, Any]) -> list[str]:
    """The drain-rate table (rates, then ratios) and the receiver-call table."""
    lines = [
        "",
        "## Drain rate (rows retired per second, higher is better)",
        "",
        "| shape | rows | "
        + " | ".join(title for _, title in COLUMNS)
        + " | "
        + " | ".join(header for _, _, header in RATIOS.values())
        + " |",
        "|---|---:|" + "---:|" * (len(COLUMNS) + len(RATIOS)),
    ]
    for shape in shapes.values():
        ratios = shape["ratios"]
        lines.append(
            f"| {shape['shape']['title']} | {shape['shape']['rows']:,} | "
            + " | ".join(_cell(shape, name) for name, _ in COLUMNS)
            + " | "
            + " | ".join(_fmt(ratios[name], 2) for name in RATIOS)
            + " |"
        )
    lines += [
        "",
        "Receiver calls (coalescing makes fewer):",
        "",
        "| shape | rows | groups | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|---:|---:|" + "---:|" * len(COLUMNS),
    ]
    for shape in shapes.values():
        calls = [
            _fmt(shape["contenders"][name]["receiver_calls"])
            if name in shape["contenders"]
            else "-"
            for name, _ in COLUMNS
        ]
        lines.append(
            f"| {shape['shape']['title']} | {shape['shape']['rows']:,} | "
            f"{shape['shape']['coalescing_groups']:,} | " + " | ".join(calls) + " |"
        )
    return lines


def markdown(data: dict[str, Any]) -> str:
    versions = data["versions"]
    lines = [
        f"# django-outboxes benchmark ({data['mode']})",
        "",
        f"{data['timestamp']} · PostgreSQL {versions['postgresql']} · Django "
        f"{versions['django']} · psycopg {versions['psycopg']} · procrastinate "
        f"{versions['procrastinate'] or '-'} · engine backend `{versions['outbox_backend']}` · "
        f"{data['machine']['cpus']} CPUs, load {data['machine']['load_average_at_start'][0]:.1f}"
        f" → {data['load_average_at_end'][0]:.1f}",
        "",
        f"Batch: {data['batch_rows']} rows, {data['batch_shards']} shards, for every contender "
        f"that batches. Each drain may run {data['drain_budget_seconds']:.0f} s; `*` marks a "
        "drain stopped there (its rate is what it retired in that time). Receivers: "
        + (
            "each reads every keyword argument it gets (`--receiver kwargs`), and the raw "
            "loop's call per row reads the row's columns by keyword."
            if data.get("receiver") == "kwargs"
            else "each only counts its calls."
        ),
    ]
    shapes = data.get("shapes", {})
    if shapes:
        lines += _drain_lines(shapes)
    from bench.report_other import other_lines

    lines += other_lines(data)
    if data.get("problems"):
        lines += ["", "## Problems", ""] + [f"- {problem}" for problem in data["problems"]]
    lines += [
        "",
        f"Total run time {data['total_seconds']:.0f} s. See bench/README.md for "
        "what each contender does and what is (and is not) comparable.",
        "",
    ]
    return "\n".join(lines)


def write(data: dict[str, Any], folder: Path, stem: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (folder / f"{stem}.{ext}" for ext in ("json", "md", "png"))
    json_path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    md_path.write_text(markdown(data))
    written = [json_path, md_path]
    from bench.report_chart import chart

    if chart(data, png_path):
        written.append(png_path)
    return written
