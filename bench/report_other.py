"""The Markdown report's "Other measurements" table: write overhead, synchronous flush,
coalescing, scale, then each section's own lines. Split out of `bench/report.py`.
"""

from __future__ import annotations

from typing import Any

from bench.report import _fmt


def other_lines(data: dict[str, Any]) -> list[str]:
    """The "Other measurements" table, then the sections' own lines."""
    lines = ["", "## Other measurements", "", "| measurement | value |", "|---|---:|"]
    if "write_overhead" in data:
        write = data["write_overhead"]
        per_op = write["per_op_us"]
        lines += write_overhead_lines(write)
        if "procrastinate_ratio" in write:
            lines.append(
                f"| write overhead: save + procrastinate defer ÷ save alone | "
                f"{write['procrastinate_ratio']:.2f}x ({per_op['save_procrastinate']:.0f} µs) |"
            )
    if "sync_flush" in data:
        sync = data["sync_flush"]
        lines.append(
            f"| synchronous flush, commit → receiver ({sync['iterations']:,} flushes) | "
            f"p50 **{sync['p50_ms']:.2f} ms**, p99 **{sync['p99_ms']:.2f} ms** |"
        )
        if "floor" in sync:
            floor = sync["floor"]
            lines.append(
                f"| its floor, psycopg: COMMIT, then lease + read in one statement | "
                f"p50 {floor['p50_ms']:.2f} ms, p99 {floor['p99_ms']:.2f} ms; ours ÷ floor "
                f"p50 **{sync['p50_over_floor']:.2f}x**, p99 {sync['p99_over_floor']:.2f}x |"
            )
        if "prepared" in sync:
            prepared = sync["prepared"]
            lines.append(
                "| synchronous flush, `prepare_threshold` set (the engine prepares) | "
                f"p50 **{prepared['p50_ms']:.2f} ms**, p99 **{prepared['p99_ms']:.2f} ms**; "
                f"÷ floor p50 {prepared['p50_over_floor']:.2f}x, "
                f"p99 {prepared['p99_over_floor']:.2f}x |"
            )
    if "coalescing" in data:
        co = data["coalescing"]
        lines.append(
            f"| coalescing: {co['updates']:,} updates over {co['objects']:,} objects "
            f"(1 process) | {co['rows_retired']:,} rows retired, {co['receiver_calls']:,} "
            f"receiver calls, {co['seconds']:.2f} s |"
        )
    if "scale" in data:
        scale = data["scale"]
        for step in scale["steps"]:
            lines.append(
                f"| scale: drain rate at {step['backlog_rows']:,} backlog rows "
                f"({step['shards']:,} shards, 1 process) | {_fmt(step['per_s'])} rows/s"
                f"{'' if step['complete'] else '*'} ({step['seconds']:.1f} s) |"
            )
        if scale["ratio"] is not None:
            lines.append(f"| scale: per-row rate {scale['ratio_of']} | **{scale['ratio']:.2f}x** |")
    from bench import sections

    lines += sections.markdown(data)
    return lines


def write_overhead_lines(write: dict[str, Any]) -> list[str]:
    """Both write paths, each beside its own floor measured in the same run."""
    per_op = write["per_op_us"]
    lines = [
        f"| write overhead, default path (Django's save INSERTs the row): save + outbox row "
        f"÷ save alone ({write['iterations_each']:,} each) | **{write['ratio']:.2f}x** "
        f"({per_op['save']:.0f} µs → {per_op['save_outbox']:.0f} µs) |",
        f"| its floor: save + the same INSERT by hand, own round trip ÷ save alone | "
        f"{write['sql_floor_ratio']:.2f}x ({per_op['save_sql']:.0f} µs) |",
    ]
    if "orm_floor_ratio" in write:
        lines.append(
            f"| its ORM floor: save + the same row through Django's own Model.save ÷ save "
            f"alone | {write['orm_floor_ratio']:.2f}x ({per_op['save_orm']:.0f} µs) |"
        )
    if "deferred_ratio" in write:
        lines += [
            f"| write overhead, deferred path (one bulk insert with the COMMIT): save + "
            f"outbox row ÷ save alone | **{write['deferred_ratio']:.2f}x** "
            f"({per_op['save_outbox_deferred']:.0f} µs) |",
            f"| its floor: save + the same INSERT by hand, COMMIT in its round trip ÷ save "
            f"alone | {write['deferred_sql_floor_ratio']:.2f}x "
            f"({per_op['save_sql_commit']:.0f} µs) |",
        ]
    if "deferred_sql_floor_row_ratio" in write:
        lines.append(
            f"| that floor plus building the row's model instance (the API's input) ÷ save "
            f"alone | {write['deferred_sql_floor_row_ratio']:.2f}x "
            f"({per_op['save_sql_commit_row']:.0f} µs) |"
        )
    return lines
