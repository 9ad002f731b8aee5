"""Log lines and Markdown of the relays section (`bench.relays`)."""

from __future__ import annotations

from typing import Any


def progress(kind: str, concurrency: int, run: dict[str, Any]) -> str:
    """One log line per run."""
    return (
        f"relays {kind:<8} c{concurrency:<3} {run['messages']:>7,} msgs / {run['shards']:,} "
        f"shards in {run['seconds']:6.2f}s = {run['per_s']:>8,.0f}/s, "
        f"mean batch {run['mean_batch']:.1f} ({run['publishes']:,} publishes); "
        f"raw at {run['raw_batch']}: "
        f"{run['raw_per_s']:>8,.0f}/s; lost {run['lost']}, duplicates {run['duplicates']}, "
        f"shards out of order {run['order_violations']}"
    )


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def _row(relay: dict[str, Any]) -> str:
    ideal = relay.get("ideal_per_s")
    base = f"ideal {ideal:,.0f}" if ideal else f"raw {relay['raw_per_s']:,.0f}"
    return (
        f"| {relay['title']} | {relay['messages']:,} / {relay['shards']:,} "
        f"| {relay['concurrency']} | {relay['per_s']:,.0f} | {base} "
        f"| **{relay['ratio']:.2f}** | {relay['goal_text']} | {_met(relay['met'])} "
        f"| {relay['lost']} | {relay['order_violations']} "
        f"| {relay['mean_batch']:.1f} ({relay['publishes']:,}) "
        f"| {relay['engine_alone_per_s']:,.0f} |"
    )


def markdown(result: dict[str, Any]) -> list[str]:
    start, end = result["load_average_start"][0], result["load_average_end"][0]
    rounds = result["rounds"]
    lines = [
        "PostgreSQL. Ours: the messages (one per shard per round, each its own object, "
        "no coalescing) loaded into RegionOutbox and drained by one-shot "
        "`drain_outboxes(concurrency=N)` calls on kept slot threads, timed to empty, "
        "the relay's connections made beforehand; read back by a consumer (lost: never "
        "read; out of order: shards whose messages were read out of their order). Raw: "
        "the same messages (the same CloudEvents JSON and headers) published by a hand "
        "loop with the client alone, in batches of the mean batch ours published, "
        "confirmed once per batch (webhooks: a request per message, below). Engine "
        "alone: the same rows drained the same way to a receiver that returns at once. "
        "Load average "
        f"{start:.2f} at the start, {end:.2f} at the end"
        + (f"; median of {rounds} rounds." if rounds > 1 else "."),
        "",
        "| relay | messages / shards | concurrency | ours msg/s | floor msg/s | ratio "
        "| goal | met | lost | order violations | mean batch (publishes) | engine alone msg/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    skipped = []
    for kind, relay in result["relays"].items():
        if "skipped" in relay:
            skipped.append(f"{kind} skipped: {relay['skipped'].rstrip('.')}.")
        else:
            lines.append(_row(relay))
    lines += ["", *_floors(result["relays"])]
    if skipped:
        lines += ["", *skipped]
    return lines


def _floors(relays: dict[str, Any]) -> list[str]:
    """What each floor is, and the webhook's raw loop beside the ideal it is judged by."""
    lines = []
    for relay in relays.values():
        if "skipped" in relay:
            continue
        batches = "" if relay.get("ideal_per_s") else f", batches of {relay['raw_batch']}"
        line = (
            f"- {relay['title']}: floor = {relay['floor']}{batches}; "
            f"ours published {_sizes(relay['batch_sizes'])}"
        )
        if relay.get("ideal_per_s"):
            line += (
                f"; {relay['raw_per_s']:,.0f} msg/s, ours ÷ it {relay['raw_ratio']:.2f}. "
                f"Ideal: min(shards, concurrency {relay['concurrency']}) / "
                f"{relay['delay_ms']:.0f} ms"
            )
        lines.append(line + ".")
    return lines


def _sizes(sizes: dict[Any, int], shown: int = 6) -> str:
    """The most frequent batch sizes, e.g. `1 x 120, 7 x 118, ...` (size x publishes)."""
    common = sorted(sizes.items(), key=lambda item: -item[1])
    text = ", ".join(f"{size} x {count:,}" for size, count in common[:shown])
    return text + (", ..." if len(common) > shown else "") + " (batch size x publishes)"
