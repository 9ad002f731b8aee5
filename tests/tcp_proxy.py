"""A TCP forwarder on 127.0.0.1 that a test puts between a client and a real server, to
cut the line: `stop()` closes every forwarded connection and the listening socket (new
connections are refused), `start()` listens again on the same port."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0  # chosen by the system at the first start, kept after
        self.connections = 0  # connections forwarded so far
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.05)  # the accept loop sees stop() within this
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)

    def stop(self) -> None:
        """Cut: refuse new connections and close every open one, both sides."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)
        for thread in self._threads:
            thread.join(5)
        self._threads = [thread for thread in self._threads if thread.is_alive()]

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by stop()
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            for sock in (client, server):
                sock.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    _close(client)
                    _close(server)
                    return
                self._open.update((client, server))
                self.connections += 1
            self._spawn(self._pump, client, server)
            self._spawn(self._pump, server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        with self._lock:
            self._open.difference_update((source, sink))
        _close(source)
        _close(sink)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="tcp-proxy")
        thread.start()
        self._threads.append(thread)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
