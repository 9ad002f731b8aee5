"""Webhooks in the relays section (`bench.relays`): a `WebhookRelay` POSTing to a local
endpoint that answers after a fixed delay (`bench.relays_server`, in a process of its
own), judged against the ideal: every slot's request in flight all the time,
min(shards, concurrency) / delay. The client alone is measured beside it, for reference
(the goal is the ideal's): `concurrency` threads, each POSTing the messages of its
shards one after another on one shared urllib3 pool, each signed as the relay signs.
It shows what the client and the endpoint cost on this machine without the engine."""

from __future__ import annotations

import base64
import hashlib
import hmac
import multiprocessing
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.relays_common import Counting, RawMessage, cloudevent
from bench.relays_server import RECORDS, serve
from outbox.relays.webhooks import WebhookRelay

DELAY_S = 0.005


class CountingWebhookRelay(Counting, WebhookRelay):
    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.batches.append(1)  # a request per message, sent by the slot that delivers it
        super().__call__(*args, **kwargs)


class Webhook:
    kind = "webhook"

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
        self.floor = f"urllib3 alone: {concurrency} threads POSTing on one pool (reference)"

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
        """`concurrency` threads, each POSTing its share of the shards' messages in
        order, on one urllib3 pool (`size` is not used: the relay sends a request per
        message). Seconds taken (the first request untimed)."""
        import urllib3

        pool = urllib3.PoolManager(maxsize=self.concurrency, block=False)
        lanes: list[list[RawMessage]] = [[] for _ in range(self.concurrency)]
        for message in messages:
            lanes[message.shard % self.concurrency].append(message)

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
            answer = pool.request("POST", self.url + "/hook", body=body, headers=headers)
            if answer.status >= 300:
                raise RuntimeError(f"the endpoint answered {answer.status}")

        def run(lane: list[RawMessage]) -> None:
            for message in lane:
                post(message)

        try:
            post(RawMessage(0, 0))
            started = time.perf_counter()
            with ThreadPoolExecutor(self.concurrency) as threads:
                list(threads.map(run, lanes))
            return time.perf_counter() - started
        finally:
            pool.clear()

    def close(self) -> None:
        self.server.terminate()
        self.server.join(10)

    def ideal_per_s(self, shards: int) -> float:
        return min(shards, self.concurrency) / DELAY_S

    def describe(self) -> dict[str, Any]:
        return {"delay_ms": DELAY_S * 1000, "concurrency": self.concurrency}
