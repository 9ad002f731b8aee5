"""The webhook endpoint of the relays section (`bench.relays_webhook`): answers each POST
204 after a fixed delay and notes, per request, the shard header and the CloudEvents
subject, in the order the requests came. ``GET /records`` returns those notes as JSON,
``DELETE /records`` forgets them. It runs in a process of its own (`serve`).

It stands for a service on another machine, yet shares this one's cores with the relay
and the database: so it is an asyncio server reading HTTP/1.1 with keep-alive and
nothing more (no thread per connection, no header objects), to take as little CPU from
them as it can.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

RECORDS = "/records"
_NO_CONTENT = b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"


class _Endpoint:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.records: list[list[Any]] = []

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after another on one connection, until the client closes it."""
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = _parse(head)
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                writer.write(await self.answer(method, path, headers, body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        if method == "POST":
            self.records.append([headers.get("outbox-shard", ""), int(json.loads(body)["subject"])])
            await asyncio.sleep(self.delay)
            return _NO_CONTENT
        if method == "GET" and path == RECORDS:
            data = json.dumps(self.records).encode()
            return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)
        if method == "DELETE" and path == RECORDS:
            self.records = []
            return _NO_CONTENT
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    """The method, path and headers (names in lower case) of a request's head."""
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def serve(delay: float, port: Any) -> None:
    """Serve until the process is ended; put the port chosen in the queue `port`."""

    async def main() -> None:
        endpoint = _Endpoint(delay)
        server = await asyncio.start_server(endpoint.connection, "127.0.0.1", 0, backlog=1024)
        port.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())
