"""How big the relays section (`bench.relays`) is in each mode, the concurrency of its
drains and the goals it judges them by."""

from __future__ import annotations

from dataclasses import dataclass

# The drain's slot threads (`drain_outboxes(concurrency=N)`). Calls the slots make at
# the same time are published together, so the batch a relay publishes, and with it the
# round trips and confirms per message, grows with N: 32 is the value the relays how-to
# gives, and the bound of a batch (one message per slot in a call at that moment).
CONCURRENCY = 32
# The webhook relay is measured at two concurrencies (the drain's and the relay's own,
# how many requests it has in flight): its ideal grows with them, while the client's
# own work per request does not shrink, so the two show where the client becomes the
# bound.
WEBHOOK_CONCURRENCIES = (8, 32)

BROKER_GOAL = 0.7  # ours at least 0.7 x the raw client loop at the same batch size
WEBHOOK_GOAL = 0.6  # ours at least 0.6 x min(shards, concurrency) / the endpoint's delay


@dataclass(frozen=True)
class Sizes:
    broker: tuple[int, int]  # shards, messages per shard (RabbitMQ, Redis, Kafka)
    webhook: tuple[int, int]  # shards, messages per shard
    rounds: int  # each relay's median of this many runs (ours and its floor each time)
    budget_s: float  # seconds a drain may take


MODES = {
    "smoke": Sizes((100, 5), (200, 2), 1, 30.0),
    "quick": Sizes((1_000, 10), (200, 10), 1, 60.0),
    "full": Sizes((1_000, 100), (200, 50), 3, 180.0),
}
