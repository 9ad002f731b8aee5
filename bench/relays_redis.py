"""Redis Streams in the relays section (`bench.relays`): a `RedisStreamRelay` against a
raw pipeline of ``XADD``s, each on a stream of the run's own (deleted at the end)."""

from __future__ import annotations

import os
import secrets
import time

from bench.relays_common import Counting, RawMessage, batches, cloudevent, subject
from outbox.relays.redis_streams import RedisStreamRelay

READ_CHUNK = 10_000


class CountingRedisStreamRelay(Counting, RedisStreamRelay):
    pass


class RedisStreams:
    kind = "redis"
    title = "Redis stream"
    floor = "redis-py: one pipeline of XADD per batch (no MULTI)"

    def __init__(self) -> None:
        import redis

        self.url = os.environ.get("OUTBOX_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        self.stream = f"outbox-bench-relays-{secrets.token_hex(4)}"
        self.raw_stream = f"{self.stream}-raw"
        self.client = redis.Redis.from_url(self.url, socket_timeout=30)
        self.client.ping()  # no server: skipped, at once

    def relay(self, name: str) -> CountingRedisStreamRelay:
        return CountingRedisStreamRelay(name, url=self.url, stream=self.stream)

    def read(self, count: int) -> list[tuple[str, int]]:
        """Every entry of the relay's stream, in stream order."""
        read: list[tuple[str, int]] = []
        start = "-"
        while True:
            entries = self.client.xrange(self.stream, min=start, count=READ_CHUNK)
            for _, fields in entries:
                read.append((fields[b"outbox-shard"].decode(), subject(fields[b"body"])))
            if len(entries) < READ_CHUNK:
                return read
            start = "(" + entries[-1][0].decode()

    def clear(self) -> None:
        self.client.delete(self.stream, self.raw_stream)

    def raw(self, messages: list[RawMessage], size: int) -> float:
        """The raw floor: a pipeline of ``XADD`` per batch, the same fields as the
        relay's entries. Seconds taken (connecting untimed)."""
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=30)
        try:
            client.ping()
            started = time.perf_counter()
            for batch in batches(messages, size):
                with client.pipeline(transaction=False) as pipeline:
                    for message in batch:
                        _, body, headers = cloudevent(message)
                        fields: dict[str, str | bytes] = dict(headers)
                        fields["content-type"] = "application/cloudevents+json"
                        fields["body"] = body
                        pipeline.xadd(self.raw_stream, fields)  # type: ignore[arg-type]
                    pipeline.execute()
            return time.perf_counter() - started
        finally:
            client.close()

    def close(self) -> None:
        self.clear()
        self.client.close()
