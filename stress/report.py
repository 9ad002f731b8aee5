"""Publishing: stress/results/<name>.json holds one object per database (a run updates its
own entry and keeps the others), <name>.md the same as a table, one column per database.
Also the verdict: what makes a run fail."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

Row = tuple[str, Callable[[dict[str, Any]], Any]]


def _kinds(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in counts.items()) or "none"


def _graceful(r: dict[str, Any]) -> str:
    g = r["graceful"]
    if not g["stops"]:
        return "none"
    return (
        f"{g['stops']} stops, {g['failed']} failed; exit ≤ {g['max_exit_s']} s "
        f"(timeout {r['graceful_timeout_s']:g} s); shard resumed ≤ {g['max_resume_s']} s "
        f"after it had work due, {g['resumed_within_old_lease']} of {g['stops']} while the "
        f"old lease ({r['lease_seconds']:g} s) would still have held it"
    )


def _pair(r: dict[str, Any], key: str, detail: str) -> str:
    return f"{r[key]} ({r[detail]})"


ROWS: list[Row] = [
    ("messages (shards)", lambda r: f"{r['messages']} ({r['shards']})"),
    (
        "slots per drainer; receiver wait",
        lambda r: f"{r.get('concurrency', 1)}; {r.get('receiver_ms', 0):g} ms",
    ),
    ("receiver calls (by sync flush)", lambda r: f"{r['receiver_calls']} ({r['flush_calls']})"),
    (
        "writers; drainers; unsettled bound",
        lambda r: f"{r['writers']}; {r['drainers']}; {r['unsettled_seconds']:g} s",
    ),
    ("faults", lambda r: _kinds(r["faults"])),
    ("largest backlog (rows; at)", lambda r: f"{r['max_backlog']} ({r['max_backlog_at_s']} s)"),
    ("lost", lambda r: r["lost"]),
    ("phantoms (rolled back, delivered)", lambda r: r["phantoms"]),
    ("order violations (unverified)", lambda r: _pair(r, "order_violations", "order_unverified")),
    ("overlaps (after a hung call)", lambda r: f"{r['overlaps']} ({r['hung_overlaps']})"),
    ("calls without the lease", lambda r: r["unleased_calls"]),
    ("duplicate receiver calls", lambda r: r["duplicates"]),
    ("… explained by", lambda r: _kinds(r["duplicates_explained"])),
    ("… of batches settling behind", lambda r: r["duplicates_settling"]),
    ("… oldest delivery redelivered (s before its fault)", lambda r: r["oldest_redelivered_s"]),
    (
        "… per fault (most from one fault)",
        lambda r: _pair(r, "duplicates_per_fault", "duplicates_one_fault_max"),
    ),
    (
        "… per fault in a backlog ≥ 1000 rows (faults)",
        lambda r: _pair(r, "duplicates_per_fault_in_backlog", "faults_in_backlog"),
    ),
    ("… per fault, by kind", lambda r: _kinds(r["duplicates_per_fault_by_kind"])),
    ("… unexplained", lambda r: r["unexplained_duplicates"]),
    ("inbox receiver: effects (inbox wait)", lambda r: f"{r['effects']} ({r['effect_ms']:g} ms)"),
    ("… deliveries skipped as applied", lambda r: r["inbox_skips"]),
    ("… duplicate effects", lambda r: r["duplicate_effects"]),
    ("… lost effects (superseded)", lambda r: _pair(r, "lost_effects", "superseded_effects")),
    ("… phantom effects; id mismatches", lambda r: _effect_errors(r)),
    ("slowest recovery", lambda r: f"{r['slowest_recovery_s']} s"),
    ("graceful stops", _graceful),
    ("restarts (crashes)", lambda r: f"{r['restarts']} ({r['crashes']})"),
    ("drained; run, check", lambda r: f"{r['drained']}; {r['seconds']} s, {r['check_seconds']} s"),
    ("load average at start (end)", lambda r: f"{r['load_average']} ({r['load_average_end']})"),
]


# The relay leg's rows (`stress/consumer.py`), shown when a run has them.
RELAY_ROWS: list[Row] = [
    (
        "relay: messages in the queue (repeats)",
        lambda r: f"{r['relay_received']} ({r['relay_repeats']})",
    ),
    (
        "… confirmed by the broker (missing from the queue)",
        lambda r: _pair(r, "relay_confirmed", "relay_confirmed_missing"),
    ),
    (
        "… reported failed (copies arrived unconfirmed)",
        lambda r: _pair(r, "relay_failures_reported", "relay_arrived_unconfirmed"),
    ),
    ("… lost; phantoms", lambda r: f"{r['relay_lost']}; {r['relay_phantoms']}"),
    (
        "… order violations (unverified)",
        lambda r: _pair(r, "relay_order_violations", "relay_order_unverified"),
    ),
    ("… group regressions; id mismatches", lambda r: _relay_errors(r)),
    ("… broker cuts", lambda r: r["faults"].get("broker_cut", 0)),
]


def _relay_errors(r: dict[str, Any]) -> str:
    return f"{r['relay_group_regressions']}; {r['relay_id_mismatches']}"


def _effect_errors(r: dict[str, Any]) -> str:
    return f"{r['phantom_effects']}; {r['effect_id_mismatches']}"


FAILING = (
    "lost",
    "phantoms",
    "order_violations",
    "overlaps",
    "unleased_calls",
    "unexplained_duplicates",
    "duplicate_effects",
    "lost_effects",
    "phantom_effects",
    "effect_id_mismatches",
)
RELAY_FAILING = (
    "relay_lost",
    "relay_phantoms",
    "relay_confirmed_missing",
    "relay_group_regressions",
    "relay_order_violations",
    "relay_id_mismatches",
)


def problems(result: dict[str, Any]) -> list[str]:
    """Why this run fails; empty when it passes. `fault_kinds`: those the run injects
    (none: a run without faults, where duplicates must be 0 too)."""
    kinds = result["fault_kinds"]
    failing = (*FAILING, *RELAY_FAILING) if "relay_received" in result else FAILING
    found = [f"{key} {result[key]}" for key in failing if result[key]]
    if not kinds and result["duplicates"]:
        found.append(f"duplicates {result['duplicates']} without faults")
    if not kinds and result.get("relay_repeats"):
        found.append(f"relay_repeats {result['relay_repeats']} without faults")
    if not result["drained"]:
        found.append(f"not drained: {result['left_in_outbox']} rows left")
    missing = [kind for kind in kinds if kind not in result["faults"]]
    if missing:
        found.append(f"faults never injected: {', '.join(missing)}")
    for stop in result["graceful_stops"]:
        if stop["problems"]:
            found.append(f"graceful stop on shard {stop['shard']}: {', '.join(stop['problems'])}")
    return found


def publish(name: str, database: str, result: dict[str, Any]) -> str:
    """Merge this database's result into <name>.json and rewrite <name>.md; the table."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged[database] = result
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    names = sorted(merged)
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    relay = any("relay_received" in merged[n] for n in names)
    for label, cell in [*ROWS, *RELAY_ROWS] if relay else ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(cell, merged[n]) for n in names) + " |")
    table = "\n".join(lines) + "\n"
    runs = "\n".join(f"- {n}: {merged[n].get('finished', '?')}" for n in names)
    (RESULTS / f"{name}.md").write_text(f"# Stress run `{name}`\n\n{table}\nRuns:\n{runs}\n")
    return table


def _cell(cell: Callable[[dict[str, Any]], Any], row: dict[str, Any]) -> str:
    try:
        return str(cell(row))
    except (KeyError, TypeError):  # an entry written by an older runner
        return "?"
