"""The relay leg's broker side (`--relay amqp`): RabbitMQ behind a TCP proxy the runner
owns, a durable queue of the run's own bound to an exchange of the run's own, and the
queue read back once the run is over.

The drainers and writers publish through the proxy (STRESS_AMQP_URL names its port), so
the `broker_cut` fault can cut every connection to the broker and refuse new ones for a
few seconds without touching RabbitMQ, which other runs share. Names carry a random
suffix; the queue also expires by itself an hour after its last use, should the run die
before it deletes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.tcp_proxy import TcpProxy, _close

CUT_SECONDS = 3.0  # how long a broker cut refuses connections
HOLD_SECONDS = 1.0  # before it, the broker's replies held back (below the confirm timeout)


class HoldingProxy(TcpProxy):
    """The tests' TCP proxy, which can also hold back what the broker sends (`replies`
    cleared): publishes still reach the broker, their confirms wait. A cut while they
    wait drops them, so the relay reports failed what the queue took."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.replies = threading.Event()
        self.replies.set()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            from_broker = source.getpeername()[:2] == self.target
        except OSError:
            from_broker = False
        if not from_broker:
            super()._pump(source, sink)
            return
        try:
            while chunk := source.recv(65536):
                while not self.replies.wait(0.05):
                    if sink.fileno() < 0:  # closed by a cut meanwhile: drop what is held
                        raise OSError("cut")
                sink.sendall(chunk)
        except OSError:
            pass
        with self._lock:
            self._open.difference_update((source, sink))
        _close(source)
        _close(sink)


@dataclass(frozen=True)
class Received:
    """One message as the consumer read it, in queue order."""

    message_id: str
    shard: int
    category: int
    obj: int
    seq: int
    sseq: int
    redelivered: bool
    consistent: bool  # the AMQP message_id, the header and the CloudEvents id agree


class Broker:
    """The run's exchange, queue and proxy (`start`), read back and removed (`finish`)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.host = os.environ.get("STRESS_AMQP_HOST", "127.0.0.1")
        self.port = int(os.environ.get("STRESS_AMQP_PORT", "5672"))
        self.name = f"outbox-stress-{secrets.token_hex(4)}"
        self.proxy = HoldingProxy(self.host, self.port)
        self.cuts = 0
        self.declared = False

    def _url(self, port: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{port}//" if port else ""

    def _connection(self) -> Any:
        import kombu

        return kombu.Connection(f"amqp://guest:guest@{self.host}:{self.port}//")

    def start(self) -> dict[str, str]:
        """Declare the exchange and queue (before any process publishes, so the queue
        takes every message), start the proxy; the environment the processes need."""
        with self._connection() as conn:
            channel = conn.default_channel
            channel.exchange_declare(self.name, "topic", durable=True, auto_delete=False)
            channel.queue_declare(
                self.name, durable=True, auto_delete=False, arguments={"x-expires": 3_600_000}
            )
            channel.queue_bind(self.name, self.name, "#")
        self.declared = True
        self.proxy.start()
        return {
            "STRESS_RELAY": "amqp",
            "STRESS_AMQP_URL": self._url(self.proxy.port),
            "STRESS_AMQP_EXCHANGE": self.name,
        }

    def cut(self, seconds: float = CUT_SECONDS, hold: float = HOLD_SECONDS) -> dict[str, Any]:
        """Hold the broker's replies for `hold` seconds, then cut every connection through
        the proxy (the replies held are dropped) and refuse new ones for `seconds`."""
        before = self.proxy.connections
        self.proxy.replies.clear()
        time.sleep(hold)
        started = time.time()
        self.proxy.stop()
        self.proxy.replies.set()
        time.sleep(seconds)
        self.proxy.start()
        self.cuts += 1
        done = time.time()
        return {
            "cut_at": started,
            "until": done,
            "cut_s": round(done - started, 2),
            "opened": before,
        }

    def finish(self) -> list[Received]:
        """Stop the proxy, read the whole queue (saved as consumed.jsonl in the run's
        directory for a recheck), then delete the queue and the exchange."""
        self.proxy.stop()
        if not self.declared:  # the run failed before it began
            return []
        try:
            raw = self._read_all()
        finally:
            with self._connection() as conn:
                conn.default_channel.queue_delete(self.name)
                conn.default_channel.exchange_delete(self.name)
        with (self.tmp / "consumed.jsonl").open("w") as out:
            for item in raw:
                out.write(json.dumps(item) + "\n")
        return [parse(item, _categories()) for item in raw]

    def _read_all(self) -> list[dict[str, Any]]:
        """Every message in the queue, in order: consumed without acknowledgements until
        as many arrived as the queue held (nothing publishes any more)."""
        got: list[dict[str, Any]] = []

        def take(message: Any) -> None:
            body = message.body  # py-amqp decodes a utf-8 body, if its encoding says so
            got.append(
                {
                    "body": body.decode() if isinstance(body, bytes) else body,
                    "headers": dict(message.headers or {}),
                    "message_id": message.properties.get("message_id"),
                    "redelivered": bool(message.delivery_info.get("redelivered")),
                }
            )

        with self._connection() as conn:
            channel = conn.default_channel
            _, count, _ = channel.queue_declare(self.name, passive=True)
            channel.basic_consume(self.name, no_ack=True, callback=take)
            idle_until = time.monotonic() + 10
            while len(got) < count and time.monotonic() < idle_until:
                seen = len(got)
                with contextlib.suppress(TimeoutError):  # none this second
                    conn.drain_events(timeout=1)
                if len(got) > seen:
                    idle_until = time.monotonic() + 10
        return got


def parse(item: dict[str, Any], categories: dict[str, int]) -> Received:
    """A consumed message as the checker needs it (a structured CloudEvents body;
    `categories`: their values by name)."""
    event = json.loads(item["body"])
    headers = item["headers"]
    ids = {item["message_id"], headers.get("outbox-message-id"), event.get("id")}
    return Received(
        message_id=event["id"],
        shard=int(headers["outbox-shard"].split(":")[1]),
        category=categories[headers["outbox-category"]],
        obj=int(event["subject"]),
        seq=int(event["data"]["seq"]),
        sseq=int(event["data"]["sseq"]),
        redelivered=item["redelivered"],
        consistent=len(ids) == 1,
    )


def load(tmp: Path) -> list[Received] | None:
    """What a finished relay run's consumer read (None: not a relay run)."""
    path = tmp / "consumed.jsonl"
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    return [parse(json.loads(line), _categories()) for line in lines if line]


def _categories() -> dict[str, int]:
    from stress.outboxes import StressCategory

    return {category.name: int(category) for category in StressCategory}
