"""The metrics endpoint's HTTP server: one GET of the registry per connection, bounded.

``prometheus_client``'s own server starts a thread for every connection and reads
whatever it is sent for as long as it is sent, so a slow-loris (connections that send a
byte now and then) takes a descriptor and a thread each without end. This one
(:class:`MetricsServer`) serves at most :data:`MAX_CONNECTIONS` connections at once (one
more is closed at accept), reads at most :data:`MAX_REQUEST_BYTES` of request line and
headers, and gives a connection :data:`REQUEST_TIMEOUT` seconds in all to send its request
and take the answer. It runs in threads of its own: the broker's event loop and its
descriptors are not touched by what a scraper does (docs/serve.md, "Metrics", "Security").
"""
from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["MetricsServer", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "REQUEST_TIMEOUT"]

#: Connections served at once; one more is closed as soon as it is accepted.
MAX_CONNECTIONS = 4
#: The most bytes of request line and headers read from a connection (431 past it).
MAX_REQUEST_BYTES = 8192
#: Seconds a connection has to send its whole request, and again to take the answer.
REQUEST_TIMEOUT = 10.0
_PATHS = (b"/metrics", b"/")


def _reply(sock: socket.socket, status: str, body: bytes = b"", ctype: str = "text/plain; charset=utf-8",
           head_only: bool = False) -> None:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    sock.sendall(head if head_only else head + body)


def _head_end(buf: bytearray) -> int:
    """Where the request line and headers of ``buf`` end (the blank line), -1 if not yet."""
    ends = [i for i in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else -1


class _Handler(socketserver.BaseRequestHandler):
    """One request: GET or HEAD of /metrics (or /); the connection is closed after it."""

    server: MetricsServer

    def handle(self) -> None:
        """Read the request within the bounds, answer it."""
        sock: socket.socket = self.request
        srv = self.server
        deadline = time.monotonic() + srv.request_timeout
        buf = bytearray()
        try:
            while True:
                end = _head_end(buf)
                if (len(buf) if end < 0 else end) > srv.max_request_bytes:
                    sock.settimeout(srv.request_timeout)
                    return _reply(sock, "431 Request Header Fields Too Large")
                if end >= 0:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return  # too slow: closed unanswered
                sock.settimeout(left)
                chunk = sock.recv(4096)
                if not chunk:
                    return
                buf += chunk
            sock.settimeout(srv.request_timeout)  # sendall: for the whole answer
            parts = bytes(buf.split(b"\n", 1)[0]).split()
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
                return _reply(sock, "400 Bad Request")
            method, path = parts[0], parts[1].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                return _reply(sock, "405 Method Not Allowed")
            if path not in _PATHS:
                return _reply(sock, "404 Not Found")
            _reply(sock, "200 OK", generate_latest(srv.registry), CONTENT_TYPE_LATEST, method == b"HEAD")
        except OSError:  # a timeout, a reset: the connection goes
            return


class MetricsServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The registry ``registry`` over HTTP at ``(host, port)`` (port 0: a free one), served
    by :meth:`start` in a daemon thread, each connection in a thread of its own, at most
    ``max_connections`` of them (see the module docstring)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 16  # connections the kernel completes before they are accepted

    def __init__(self, host: str, port: int, registry: Any, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        super().__init__((host, port), _Handler)
        self.registry = registry
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_request_bytes = max_request_bytes
        self.active = 0  # connections being served
        self.refused = 0  # connections closed at accept (all slots taken), in all
        self._slots = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self.server_address[1])

    def start(self) -> None:
        """Serve in a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self.serve_forever, name="pylog-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket (connections being served end by
        their timeout, in their daemon threads)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(10)
            self._thread = None
        self.server_close()

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` in a thread if a slot is free, else close it at once."""
        with self._slots:
            full = self.active >= self.max_connections
            if full:
                self.refused += 1
            else:
                self.active += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: the slot goes back
            self._give_slot()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve one connection (in its thread), then give its slot back."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_slot()

    def _give_slot(self) -> None:
        with self._slots:
            self.active -= 1
