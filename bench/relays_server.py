"""The webhook endpoint of the relays section (`bench.relays_webhook`): a threaded HTTP
server (a thread per connection, keep-alive) that answers each POST 204 after a fixed
delay and notes, per request, the shard header and the CloudEvents subject, in the
order the requests came. ``GET /records`` returns those notes as JSON, ``DELETE
/records`` forgets them. It runs in a process of its own (`serve`), so its work does
not share the harness's interpreter lock."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECORDS = "/records"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests
    server: _Server

    def do_POST(self) -> None:  # the name http.server calls
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        note = [self.headers.get("outbox-shard") or "", int(json.loads(body)["subject"])]
        with self.server.lock:
            self.server.records.append(note)
        time.sleep(self.server.delay)
        self._answer(204, b"")

    def do_GET(self) -> None:
        with self.server.lock:
            body = json.dumps(self.server.records).encode()
        self._answer(200, body)

    def do_DELETE(self) -> None:
        with self.server.lock:
            self.server.records = []
        self._answer(204, b"")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a line per request would cost more than the answer."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, delay: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.delay = delay
        self.lock = threading.Lock()
        self.records: list[list[Any]] = []


def serve(delay: float, port: Any) -> None:
    """Serve until the process is ended; put the port chosen in the queue `port`."""
    server = _Server(delay)
    port.put(server.server_address[1])
    server.serve_forever()
