"""The inbox receiver's effects (`Effect` rows), checked against what committed and what
the journaling receiver delivered.

- duplicate_effects: Effect rows beyond one per message id (a message applied twice);
- lost_effects: coalescing groups whose newest committed message has no effect. An
  older message of a group may lack one (`superseded_effects`, reported): its call's
  transaction was rolled back (a drainer killed in it), and the redelivery carried a
  newer row of the group, with that row's message id. Every message of the distinct
  category is the newest of its group, so each must have its effect;
- phantom_effects: effects of messages that never committed;
- effect_id_mismatches: an effect whose message id differs from the one the journaling
  receiver was given for the same message (group, seq), or two effects of one message
  with different ids;
- inbox_skips: deliveries the inbox skipped as already applied (`Skip` rows).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from stress.journal import Group, Write

Key = tuple[int, int, int, int]  # shard, category, object, seq


def check(writes: list[Write]) -> dict[str, Any]:
    from stress.models import Effect, Journal, Skip

    effects = [
        ((s, c, o, q), str(m))
        for s, c, o, q, m in Effect.objects.values_list(
            "shard", "category", "obj", "seq", "message_id"
        )
    ]
    journaled = Journal.objects.filter(ok=True, message_id__isnull=False)
    given = {
        (s, c, o, q): str(m)
        for s, c, o, q, m in journaled.values_list("shard", "category", "obj", "seq", "message_id")
    }
    per_id = Counter(message_id for _, message_id in effects)
    applied: dict[Key, str] = {}
    mismatches = 0
    for key, message_id in effects:
        first = applied.setdefault(key, message_id)
        if message_id != first or message_id != given.get(key, message_id):
            mismatches += 1
    committed = {(*w.group, w.seq) for w in writes}
    return {
        "effects": len(effects),
        "duplicate_effects": sum(n - 1 for n in per_id.values()),
        "lost_effects": len(_lost(writes, applied)),
        "superseded_effects": _superseded(given, applied),
        "phantom_effects": sum(1 for key in applied if key not in committed),
        "effect_id_mismatches": mismatches,
        "inbox_skips": Skip.objects.count(),
    }


def _superseded(given: dict[Key, str], applied: dict[Key, str]) -> int:
    """Messages delivered to the journaling receiver without an effect, whose group has
    an effect of a newer message (one without is in `lost_effects`: its group's newest
    message has none either)."""
    newest_applied: dict[Group, int] = {}
    for shard, category, obj, seq in applied:
        group = (shard, category, obj)
        newest_applied[group] = max(newest_applied.get(group, 0), seq)
    return sum(
        1
        for shard, category, obj, seq in given
        if (shard, category, obj, seq) not in applied
        and newest_applied.get((shard, category, obj), 0) > seq
    )


def _lost(writes: list[Write], applied: dict[Key, str]) -> list[Group]:
    """Groups whose newest committed message has no effect."""
    newest: dict[Group, int] = {}
    for w in writes:
        newest[w.group] = max(newest.get(w.group, 0), w.seq)
    return [group for group, seq in newest.items() if (*group, seq) not in applied]
