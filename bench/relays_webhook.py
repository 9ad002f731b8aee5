"""Webhooks in the relays section (`bench.relays`): a `WebhookRelay` POSTing to a local
endpoint that answers after a fixed delay (`bench.relays_server`, in a process of its
own), judged against the ideal: every slot's request in flight all the time,
min(shards, concurrency) / delay. A raw httpx loop is measured beside it (each batch's
requests sent at once on a pooled client, each signed as the relay signs), for
reference only: the goal is the ideal's."""

from __future__ import annotations

import base64
import hashlib
import hmac
import multiprocessing
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.relays_common import Counting, RawMessage, batches, cloudevent
from bench.relays_server import RECORDS, serve
from outbox.relays.webhooks import WebhookRelay

DELAY_S = 0.005


class CountingWebhookRelay(Counting, WebhookRelay):
    pass


class Webhook:
    kind = "webhook"
    floor = "httpx: each batch's POSTs at once on a pooled client (reference)"

    def __init__(self, concurrency: int) -> None:
        context = multiprocessing.get_context("spawn")
        port = context.Queue()
        self.server = context.Process(
            target=serve, args=(DELAY_S, port), name="bench-webhook-endpoint", daemon=True
        )
        self.server.start()
        self.url = f"http://127.0.0.1:{port.get(timeout=30)}"
        self.key = secrets.token_bytes(24)
        self.concurrency = concurrency
        self.title = f"webhooks, endpoint answering in 5 ms, concurrency {concurrency}"

    def relay(self, name: str) -> CountingWebhookRelay:
        return CountingWebhookRelay(
            name,
            url=f"{self.url}/hook",
            secret="whsec_" + base64.b64encode(self.key).decode(),
            concurrency=self.concurrency,
        )

    def read(self, count: int) -> list[tuple[str, int]]:
        """The requests the endpoint took, in the order they came."""
        import httpx

        records = httpx.get(self.url + RECORDS, timeout=30).json()
        return [(shard, obj) for shard, obj in records]

    def clear(self) -> None:
        import httpx

        httpx.delete(self.url + RECORDS, timeout=30)

    def raw(self, messages: list[RawMessage], size: int) -> float:
        """Each batch's requests POSTed at once (one thread each) on one pooled client,
        then the next batch. Seconds taken (the first request untimed)."""
        import httpx

        unbounded = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        with (
            httpx.Client(timeout=30, limits=unbounded) as client,
            ThreadPoolExecutor(max(size, 1)) as pool,
        ):

            def post(message: RawMessage) -> None:
                message_id, body, headers = cloudevent(message)
                stamp = str(int(time.time()))
                signed = f"{message_id}.{stamp}.".encode() + body
                signature = hmac.new(self.key, signed, hashlib.sha256).digest()
                headers.update(
                    {
                        "content-type": "application/cloudevents+json",
                        "webhook-id": message_id,
                        "webhook-timestamp": stamp,
                        "webhook-signature": "v1," + base64.b64encode(signature).decode(),
                    }
                )
                client.post(self.url + "/hook", content=body, headers=headers).raise_for_status()

            post(RawMessage(0, 0))
            started = time.perf_counter()
            for batch in batches(messages, size):
                list(pool.map(post, batch))
            return time.perf_counter() - started

    def close(self) -> None:
        self.server.terminate()
        self.server.join(10)

    def ideal_per_s(self, shards: int) -> float:
        return min(shards, self.concurrency) / DELAY_S

    def describe(self) -> dict[str, Any]:
        return {"delay_ms": DELAY_S * 1000, "concurrency": self.concurrency}
