"""The network side: an asyncio server, one coroutine per connection.

Why asyncio: a broker is mostly waiting (long-polling fetches, clients that are idle or
slow, producers waiting for an fsync), and per-connection coroutines keep each of those
waits from holding anything but its own connection; the CPU work of a request (decode,
append, encode) is done in C and in a thread pool for appends. A selectors loop would do
the same with hand-written buffering and timers. The loop never waits on disk or admin
work: the admin APIs, opening partitions and the group files run in threads (see
:mod:`.broker`), so an admin storm on one connection does not stall the others.

Each connection handles its requests one at a time, in order (Kafka answers a
connection's requests in the order they came). A frame's size is checked against
``max_request_bytes`` before anything is read, and the bytes are read as they arrive, so
a lying size allocates nothing; a frame that does not decode, an API key or version not
served, or a frame not finished within ``request_timeout`` closes that connection only.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import struct
from typing import Any

from pylog.errors import InvalidArgumentError
from pylog.serve import handlers, security
from pylog.serve.broker import Broker
from pylog.serve.coordinator import API_KEYS as GROUP_KEYS
from pylog.serve.coordinator import PEER, GroupCoordinator
from pylog.serve.protocol import SERVED, Request, RequestError, build, decode_request, encode_response

__all__ = ["Server", "serve"]

log = logging.getLogger("pylog.serve")
_SIZE = struct.Struct(">i")
UNSUPPORTED_VERSION = 35
#: Bytes per write of a large response (see Server._write_large).
WRITE_SLICE = 1 << 20


class Server:
    """A listening broker. Use :meth:`start` / :meth:`stop` inside an event loop, or
    :func:`serve` to run one until SIGTERM or SIGINT.

    Parameters
    ----------
    root
        The data root.
    host, port
        Where to listen (port 0: a free port; see :attr:`port` after :meth:`start`).
    max_request_bytes
        The largest request frame accepted (Kafka's ``socket.request.max.bytes``).
    request_timeout
        Seconds a started frame may take to arrive completely.
    idle_timeout
        Seconds a connection may stay silent between requests (Kafka's
        ``connections.max.idle.ms``).
    cleanup_interval
        Seconds between two runs of retention and compaction over every topic (Kafka's
        ``log.retention.check.interval.ms``, 5 minutes); None: never (``pylog retention``
        and ``pylog compact`` cannot run while the broker holds the partitions).
    advertise
        ``HOST:PORT`` that Metadata and FindCoordinator name instead of the listening
        address (Kafka's ``advertised.listeners``), e.g. behind a proxy.
    auto_create_per_request, auto_create_rate
        At most this many topics auto-created by one Metadata request, and this many a
        second over all requests (see :class:`.Broker`).
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 9092,
                 max_request_bytes: int = 100 << 20, request_timeout: float = 30.0,
                 idle_timeout: float = 600.0, auto_create: bool = True,
                 cleanup_interval: float | None = 300.0, advertise: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, users: str | None = None,
                 auto_create_per_request: int = 100, auto_create_rate: float = 100.0) -> None:
        self.root = root
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.auto_create = auto_create
        self.cleanup_interval = cleanup_interval
        self.auto_create_per_request = auto_create_per_request
        self.auto_create_rate = auto_create_rate
        self._cleaner: asyncio.Task[None] | None = None
        self.advertise = advertise
        if (tls_cert is None) != (tls_key is None):
            raise InvalidArgumentError("TLS needs both a certificate and its key (--tls-cert, --tls-key)")
        # loopback only, unless TLS and SASL users are both given (security.py)
        security.check_listen(host, tls_cert is not None, users is not None)
        self.tls = security.tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
        self.users = security.Users(users) if users is not None else None
        self.broker: Broker | None = None
        self.coordinator: GroupCoordinator | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._busy: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Open the data root and listen."""
        self.broker = Broker(self.root, self.host, self.port, auto_create=self.auto_create,
                             auto_create_per_request=self.auto_create_per_request,
                             auto_create_rate=self.auto_create_rate)
        try:
            self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=1 << 16,
                                                      ssl=self.tls)
        except BaseException:
            self.broker.close()
            self.broker = None
            raise
        self.port = self.broker.port = self._server.sockets[0].getsockname()[1]
        if self.advertise:  # what Metadata and FindCoordinator tell clients (a proxy, a NAT)
            host, _, port = self.advertise.rpartition(":")
            self.broker.advertised_host, self.broker.port = host or self.host, int(port)
        self.coordinator = GroupCoordinator(self.broker)
        self.coordinator.start()
        if self.cleanup_interval is not None:
            self._cleaner = asyncio.create_task(self._cleanup_loop(self.cleanup_interval))
        log.info("pylog serve: listening on %s:%d, root %s", self.host, self.port, self.root)

    async def _cleanup_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.broker is not None:
                await self.broker.run_cleanup()

    async def stop(self) -> None:
        """Stop listening, let requests in flight finish, close connections, close the logs."""
        if self._server is not None:
            self._server.close()
        if self.coordinator is not None:  # answers the joins and syncs that wait
            await self.coordinator.close()
        if self._cleaner is not None:
            self._cleaner.cancel()
            await asyncio.wait({self._cleaner}, timeout=self.request_timeout)
        if self._busy:
            await asyncio.wait(set(self._busy), timeout=self.request_timeout)
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.wait(set(self._conns), timeout=5)
        if self.broker is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.broker.close)
            self.broker = None

    async def _read_frame(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await asyncio.wait_for(reader.readexactly(4), self.idle_timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            return None
        (size,) = _SIZE.unpack(head)
        if size < 8 or size > self.max_request_bytes:
            log.info("closing a connection: a request frame of %d bytes (limit %d)", size, self.max_request_bytes)
            return None
        try:  # readexactly takes what arrives, in chunks: a lying size allocates nothing
            return await asyncio.wait_for(reader.readexactly(size), self.request_timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            return None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        PEER.set(writer.get_extra_info("peername"))
        session = security.Session(tls=self.tls is not None)
        security.SESSION.set(session)
        try:
            while True:
                frame = await self._read_frame(reader)
                if frame is None:
                    break
                self._busy.add(task)
                try:
                    out = await self._handle(frame)
                    if out is False:
                        break
                    if isinstance(out, list):  # a large response's buffers
                        await self._write_large(writer, out)
                    elif out is not None:
                        writer.write(out)
                        await asyncio.wait_for(writer.drain(), self.request_timeout)
                    if session.close_after:  # a failed authentication: answered, then closed
                        break
                finally:
                    self._busy.discard(task)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _write_large(self, writer: asyncio.StreamWriter, parts: list[Any]) -> None:
        """Write a response's buffers in slices of :data:`WRITE_SLICE`, each after the last
        has (nearly) gone: the transport sends a slice straight from the buffer when it
        can and copies only what the socket did not take, where one write of the whole
        would copy all that the first send left (most of 16 MiB) and shift it per send.
        Each drain has ``request_timeout``, as a whole response has."""
        for part in parts:
            mv = memoryview(part).cast("B")
            for i in range(0, len(mv), WRITE_SLICE):
                writer.write(mv[i : i + WRITE_SLICE])
                await asyncio.wait_for(writer.drain(), self.request_timeout)

    async def _handle(self, frame: bytes) -> Any:
        """The response frame of one request, None (acks=0) or False (close the connection)."""
        try:
            req = decode_request(frame)
        except RequestError as e:
            log.info("closing a connection: %s", e)
            return False
        if req.body is None:  # ApiVersions at a version not served: answered at v0
            keys = handlers.api_versions(self.broker, None, 0)["api_keys"]
            payload = build(req.response_cls, {"error_code": UNSUPPORTED_VERSION, "api_keys": keys})
            return encode_response(req, payload)
        return await self._dispatch(req)

    async def _dispatch(self, req: Request) -> Any:
        broker = self.broker
        if broker is None:  # a connection (a TLS handshake) that finished while stopping
            return False
        key = req.api_key
        body = req.body
        session = security.SESSION.get()
        users = self.users
        if key in (17, 36):  # SASL
            if session is None or users is None:  # no users file: no mechanism offered
                data: dict[str, Any] = {"error_code": 33 if key == 17 else 34, "mechanisms": []}
            elif key == 17:
                data = session.handshake(body)
            else:
                data, session.close_after = session.authenticate(users, body)
                if session.close_after:
                    log.info("SASL %s from %s failed: %s", session.mechanism, PEER.get(), data.get("error_message"))
                elif session.user is not None:
                    log.info("SASL %s from %s: user %r", session.mechanism, PEER.get(), session.user)
            return encode_response(req, build(req.response_cls, data))
        user = session.user if session is not None else None
        if users is not None and user is None and key != 18:
            log.info("closing a connection: API key %d before SASL authentication", key)
            return False
        denied: list[Any] = []
        admin_denied: list[str] = []
        if users is not None:
            body, denied = security.filter_request(users, user, key, body)
            body, admin_denied = security.filter_admin(users, user, key, body)
        try:
            if key == 0:
                data = await broker.produce(body, req.api_version)
                if body.acks == 0:
                    return None
            elif key == 1:
                data = await broker.fetch(body, req.api_version)
            elif key in GROUP_KEYS and self.coordinator is not None:
                data = await self.coordinator.handle(key, body, req.api_version, req.client_id)
            elif key == 22:  # writes the next producer id: in an admin thread
                data = await broker.admin(broker.producers.init_producer_id, body, req.api_version)
            elif key == 3 and users is not None:  # auto-creation needs the write permission
                data = await broker.admin(handlers.metadata, broker, body, req.api_version,
                                          lambda name: users.may(user, name, True))
            elif key == 18:
                data = handlers.api_versions(broker, body, req.api_version)
            elif key in handlers.HANDLERS:  # the admin APIs: in an admin thread, never on the loop
                data = await broker.admin(handlers.HANDLERS[key], broker, body, req.api_version)
            else:  # the next step's APIs: every error code says UNSUPPORTED_VERSION
                data = {}
            if users is not None:
                security.add_denied(key, data, denied)
                security.add_admin_denied(key, data, admin_denied)
                security.filter_response(users, user, key, data)
            return encode_response(req, build(req.response_cls, data,
                                              0 if key in SERVED else UNSUPPORTED_VERSION))
        except Exception:
            log.exception("request %s v%d failed; closing its connection", key, req.api_version)
            return False


def serve(root: str, host: str = "127.0.0.1", port: int = 9092, ready: Any = None, **options: Any) -> None:
    """Run a broker until SIGTERM or SIGINT, then stop it cleanly (requests in flight are
    answered, logs flushed and closed). ``ready(server)`` is called once it listens."""

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def main() -> None:
        server = Server(root, host, port, **options)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready(server)
        await stop.wait()
        await server.stop()

    asyncio.run(main())
