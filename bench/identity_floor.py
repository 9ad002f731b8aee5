"""What a message's identity costs at the floor, with no engine in the way.

Two raw leased loops (`bench/contenders/raw_leased.py`, psycopg, one process), side by
side on the same shapes, alternating which goes first round by round: one reads what a
drain delivered before messages had an identity and calls a keyword receiver with it,
the other also reads each row's message id, headers and attempts and passes
`message_id`, `attempt`, `headers` and `using` as well. Both take the payload as
psycopg decodes it and call the receiver as a signal would (`signal`, `sender` and the
message's keywords), so the ratio is what the identity itself costs per message: a
UUID per row from the database, four more keyword arguments per call. The engine's
drain pays at least this much.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

TITLE = "Message identity at the floor"

# (one message per shard rows, ordered streams (shards, objects each), rounds)
MODES = {
    "smoke": (2_000, (20, 100), 1),
    "quick": (20_000, (100, 200), 3),
    "full": (100_000, (1_000, 100), 5),
}
BATCH_ROWS = 2_000


def measure(mode: str, log: Any = print) -> dict[str, Any]:
    from bench import shapes

    one_per_shard, (shards, objects), rounds = MODES[mode]
    results = [
        _side_by_side(shape, rounds)
        for shape in (shapes.ordered_streams(shards, objects), shapes.audit_log(one_per_shard))
    ]
    for result in results:
        log(f"identity floor: {result['title']}: {result['ratio']:.2f}")
    return {"rounds": rounds, "shapes": results}


def _side_by_side(shape: Any, rounds: int) -> dict[str, Any]:
    from bench.db import analyze, load_shape, reset

    rates: dict[bool, list[float]] = {False: [], True: []}
    for round_ in range(rounds):
        for identity in (False, True) if round_ % 2 == 0 else (True, False):
            reset()
            load_shape(shape)
            analyze()
            rates[identity].append(_drain(identity))
    before, with_identity = statistics.median(rates[False]), statistics.median(rates[True])
    return {
        "title": f"{shape.title}, {shape.rows:,} rows",
        "without_per_s": before,
        "with_per_s": with_identity,
        "runs_without_per_s": rates[False],
        "runs_with_per_s": rates[True],
        "ratio": with_identity / before if before else None,
    }


def _receiver(signal: Any, sender: Any, **kwargs: Any) -> None:
    """A receiver that returns at once, taking keywords as a signal receiver does."""


def _drain(identity: bool) -> float:
    """Rows per second of one raw leased loop through the whole table."""
    import psycopg

    from bench.contenders.raw_leased import HOLDER, statements
    from bench.db import conninfo
    from outbox.models import RegionOutbox

    claim, finish = statements(identity)
    label, receiver = RegionOutbox._meta.label_lower, _receiver
    rows = 0
    started = time.perf_counter()
    with psycopg.connect(**conninfo(), autocommit=True) as conn:
        while True:
            token = uuid.uuid4().hex
            params = {"limit": BATCH_ROWS, "label": label, "token": token, "holder": HOLDER}
            batch = conn.execute(claim, params).fetchall()
            if not batch:
                break
            for row in batch:
                kwargs = {
                    "object_identifier": row[4],
                    "shard_identifier": row[2],
                    "shard_scope": row[1],
                    "payload": row[5],
                }
                if identity:
                    kwargs["message_id"] = row[6]
                    kwargs["attempt"] = row[8] + 1
                    kwargs["headers"] = row[7] or {}
                    kwargs["using"] = "default"
                receiver(signal=None, sender=row[3], **kwargs)
            conn.execute(
                finish, {"token": token, "ids": "{" + ",".join(str(r[0]) for r in batch) + "}"}
            )
            rows += len(batch)
    return rows / (time.perf_counter() - started)


def markdown(result: dict[str, Any]) -> list[str]:
    lines = [
        "The raw leased loop with and without reading and passing each message's "
        "identity (message id, attempt, headers, `using`), side by side, alternating "
        f"which goes first; rows per second, median of {result['rounds']}. The engine's "
        "drain cannot cost less than this for the identity.",
        "",
        "| shape | without identity (rows/s) | with identity (rows/s) | with ÷ without |",
        "|---|---:|---:|---:|",
    ]
    for shape in result["shapes"]:
        ratio = shape["ratio"]
        lines.append(
            f"| {shape['title']} | {shape['without_per_s']:,.0f} | {shape['with_per_s']:,.0f} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    return lines
