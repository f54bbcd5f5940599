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
``max_request_bytes`` before anything is read; a frame that does not decode, an API key or
version not served, or a frame (its 4-byte size included, once its first byte came) not
finished within ``request_timeout`` closes that connection only.

Bounds (docs/serve.md, "Limits and defaults"): connections over ``max_connections`` or
``max_connections_per_ip`` are closed at accept, before a TLS handshake or any read; a
frame over :data:`SMALL_FRAME` bytes first takes its size from a pool shared by every
connection (``queued_max_request_bytes``, :mod:`.pool`) and nothing more is read from its
socket until it has it, so unfinished large frames hold at most the pool; a frame's bytes
are freed once decoded; a Fetch response holds its bytes of a second pool until written.
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
import errno
import importlib.util
import logging
import os
import resource
import signal
import socket
import struct
import time
from typing import Any

from pylog.errors import InvalidArgumentError, MissingExtraError
from pylog.serve import (
    acl,
    acl_admin,
    authorized,
    broker_alter,
    configs,
    handlers,
    scram_admin,
    security,
    topic_ids,
    txn_handlers,
)
from pylog.serve.broker import Broker
from pylog.serve.coordinator import API_KEYS as GROUP_KEYS
from pylog.serve.coordinator import PEER, GroupCoordinator
from pylog.serve.fetch_sessions import SLOTS, FetchSessions
from pylog.serve.pool import RESPONSE_HOLD, Pool
from pylog.serve.protocol import SERVED, Request, RequestError, build, decode_request, encode_response
from pylog.serve.txn_coordinator import TxnCoordinator
from pylog.serve.txn_limits import ID_EXPIRATION, MAX_IDS, MAX_PARTITIONS, MAX_PARTITIONS_PER_CLIENT, TxnLimits

__all__ = ["Server", "serve"]

log = logging.getLogger("pylog.serve")
_SIZE = struct.Struct(">i")
UNSUPPORTED_VERSION = 35
#: Bytes per write of a large response (see Server._write_large).
WRITE_SLICE = 1 << 20
#: Frames up to this size are read without the shared pool (heartbeats, metadata, fetch
#: requests, small produces keep flowing while large frames wait for the pool).
SMALL_FRAME = 1 << 16
#: Bytes read from a socket per step of a frame's body.
READ_STEP = 1 << 20
#: Seconds between two log lines about refused connections.
REFUSED_LOG_INTERVAL = 10.0


class _Accepted(socket.socket):
    """An accepted connection's socket: closing it (the transport does, however the
    connection ends, a failed TLS handshake included) gives its place back."""

    __slots__ = ("_on_close",)

    def close(self) -> None:
        """Close the socket and give its place back (once)."""
        done, self._on_close = getattr(self, "_on_close", None), None
        super().close()
        if done is not None:
            done()


class _Listener(socket.socket):
    """A listening socket that refuses connections over the server's limits at accept, so
    that a refused connection costs no transport, task, TLS handshake or read.

    Out of descriptors (EMFILE, ENFILE), it closes a spare descriptor kept for this, takes
    the waiting connection, closes it and opens the spare again: the connection is refused
    like one over max.connections. (asyncio's own accept loop logs a traceback per attempt,
    up to its backlog each time, and the connection stays queued.)"""

    __slots__ = ("admit", "refuse", "spare")
    admit: Any  # Server._admit
    refuse: Any  # Server._refuse
    spare: int  # a descriptor on /dev/null, -1 when there is none

    def accept(self) -> tuple[socket.socket, Any]:
        """The next connection within the limits (the others are closed here); raises
        BlockingIOError when none is waiting, as a non-blocking accept does."""
        while True:
            try:
                fd, addr = self._accept()  # type: ignore[attr-defined]
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE) or self.spare < 0:
                    raise
                self._shed(e)
                continue
            conn = _Accepted(self.family, self.type, self.proto, fileno=fd)
            on_close = self.admit(addr[0])
            if on_close is not None:
                conn._on_close = on_close
                return conn, addr
            conn.close()

    def _shed(self, e: OSError) -> None:
        """Refuse the first waiting connection with the spare descriptor's place."""
        os.close(self.spare)
        self.spare = -1
        try:
            fd, _ = self._accept()  # type: ignore[attr-defined]
            os.close(fd)
        finally:
            try:
                self.spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:  # taken meanwhile: asyncio's handling from now on
                pass
        self.refuse(f"no descriptor left ({errno.errorcode.get(e.errno or 0, e.errno)}: raise the open files "
                    f"limit or lower --max-connections)")

    def close(self) -> None:
        """Close the socket and its spare descriptor."""
        if getattr(self, "spare", -1) >= 0:
            os.close(self.spare)
            self.spare = -1
        super().close()


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (each connection and each
    open partition holds descriptors, docs/serve.md); returns (old soft, new soft)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # the kernel's own ceiling
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft, soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft, soft
        return soft, target
    return soft, soft


def return_freed_buffers() -> bool:
    """Make glibc hand large freed buffers back to the kernel: a fixed mmap threshold of
    256 KiB (``mallopt(M_MMAP_THRESHOLD)``), unless ``MALLOC_MMAP_THRESHOLD_`` is set.

    By default glibc raises its threshold to the largest block freed so far (up to 32 MiB),
    so after one big Produce or Fetch the request and response buffers of later ones come
    from the heaps of the threads that made them and stay resident when freed. Measured on
    the attacks of tests/test_serve_limits.py in one broker: 246 MiB of anonymous memory
    still held between attacks and a 526 MiB peak, against 42 MiB and 411 MiB with the fixed
    threshold. Returns whether the threshold was set (False off glibc)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    M_MMAP_THRESHOLD = -3  # malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, 256 * 1024))


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
        Seconds a started frame may take to arrive completely: its 4-byte size once the
        first of them came, then its body (also a TLS handshake's bound).
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
    max_connections, max_connections_per_ip
        Connections open at once, in all and from one IP address (Kafka's
        ``max.connections``, ``max.connections.per.ip``): more are closed at accept.
    queued_max_request_bytes
        Bytes of request frames over :data:`SMALL_FRAME` read or handled at once over all
        connections (Kafka's ``queued.max.request.bytes``); at least ``max_request_bytes``.
    fetch_max_bytes
        The most record bytes of one Fetch response (Kafka's ``fetch.max.bytes``).
    max_decompressed_bytes
        The most the compressed batches of one Produce request may decompress to, over all
        its batches and partitions; more is answered MESSAGE_TOO_LARGE.
    fence_backoff
        Seconds after a failed write or fsync fenced a partition until a produce may reopen
        it (:class:`~pylog.serve.broker.Broker`).
    data_mode
        ``"private"`` (files 0600, directories 0700) or ``"group"`` (0640, 0750): the
        process umask while the broker runs (it is per process), see
        :func:`.security.protect_root`.
    failed_auth_delay, max_failed_logins, failed_login_window
        Seconds before a failed login is answered (Kafka's
        ``connection.failed.authentication.delay.ms``) and the failed logins an address may
        have within ``failed_login_window`` seconds (:class:`.security.Logins`).
    auto_create_per_request, auto_create_rate
        At most this many topics auto-created by one Metadata request, and this many a
        second over all requests (see :class:`.Broker`).
    cleaner_backoff
        Seconds between two looks for compacted partitions due for compaction (Kafka's
        ``log.cleaner.backoff.ms``, :mod:`.cleaner`); None: only every ``cleanup_interval``.
    num_partitions, topic_defaults
        Partitions of a topic created without a count (auto-created, or CreateTopics with
        -1), and Kafka topic configs every new topic starts from (``pylog serve --config``).
    broker_configs
        What DescribeConfigs of the broker reports: name -> (value, config source, type).
    fetch_session_slots
        Incremental fetch sessions kept at once (Kafka's
        ``max.incremental.fetch.session.cache.slots``; :mod:`.fetch_sessions`).
    max_txn_partitions, max_txn_partitions_per_client, max_transactional_ids, transactional_id_expiration
        What open Kafka transactions may hold, in all and per client (a SASL user or an IP
        address), the transactional ids kept, and the seconds an idle one is kept (Kafka's
        ``transactional.id.expiration.ms``): :mod:`.txn_limits`.
    metrics_port, metrics_host
        Serve Prometheus metrics over HTTP on ``metrics_host`` (loopback unless given) at
        this port (0: a free one, see :attr:`metrics_port` after :meth:`start`; None: none),
        :mod:`.metrics`. The endpoint has no authentication: anyone who can connect reads
        topic and group names (docs/serve.md, "Security").
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 9092,
                 max_request_bytes: int = 100 << 20, request_timeout: float = 30.0,
                 idle_timeout: float = 600.0, auto_create: bool = True,
                 cleanup_interval: float | None = 300.0, advertise: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, users: str | None = None,
                 max_connections: int = 1000, max_connections_per_ip: int = 1000,
                 queued_max_request_bytes: int = 100 << 20, fetch_max_bytes: int = 55 << 20,
                 max_decompressed_bytes: int = 32 << 20, fence_backoff: float = 5.0,
                 data_mode: str = "private", failed_auth_delay: float = 0.1, max_failed_logins: int = 20,
                 failed_login_window: float = 60.0, auto_create_per_request: int = 100,
                 auto_create_rate: float = 100.0, cleaner_backoff: float | None = 15.0,
                 num_partitions: int = 1, topic_defaults: dict[str, str] | None = None,
                 broker_configs: dict[str, tuple[str, int, int]] | None = None,
                 fetch_session_slots: int = SLOTS, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1", max_txn_partitions: int = MAX_PARTITIONS,
                 max_txn_partitions_per_client: int = MAX_PARTITIONS_PER_CLIENT,
                 max_transactional_ids: int = MAX_IDS,
                 transactional_id_expiration: float = ID_EXPIRATION) -> None:
        for name, value in (("max_request_bytes", max_request_bytes), ("max_connections", max_connections),
                            ("max_connections_per_ip", max_connections_per_ip),
                            ("queued_max_request_bytes", queued_max_request_bytes),
                            ("fetch_max_bytes", fetch_max_bytes), ("max_decompressed_bytes", max_decompressed_bytes),
                            ("num_partitions", num_partitions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, not {value!r}")
        if isinstance(fetch_session_slots, bool) or not isinstance(fetch_session_slots, int) \
                or fetch_session_slots < 0:
            raise InvalidArgumentError(f"fetch_session_slots must be an integer >= 0, not {fetch_session_slots!r}")
        if metrics_port is not None and (isinstance(metrics_port, bool) or not isinstance(metrics_port, int)
                                         or not 0 <= metrics_port <= 65535):
            raise InvalidArgumentError(f"metrics_port must be a port number (0-65535), not {metrics_port!r}")
        if metrics_port is not None and importlib.util.find_spec("prometheus_client") is None:
            raise MissingExtraError("pylog serve --metrics-port", "prometheus_client", "serve")
        if not isinstance(metrics_host, str) or not metrics_host:
            raise InvalidArgumentError(f"metrics_host must be a host name or address, not {metrics_host!r}")
        self.txn_limits = TxnLimits(max_txn_partitions, max_txn_partitions_per_client,
                                    max_transactional_ids, transactional_id_expiration)
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.metrics: Any = None  # a .metrics.Metrics while it serves them
        if queued_max_request_bytes < max_request_bytes:
            raise InvalidArgumentError(f"queued_max_request_bytes ({queued_max_request_bytes}) must be at least "
                                       f"max_request_bytes ({max_request_bytes}), or no frame of that size is read")
        self.root = root
        self.fence_backoff = fence_backoff
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
        self.cleaner_backoff = cleaner_backoff
        self._compactor: asyncio.Task[None] | None = None
        self.num_partitions = num_partitions
        self.topic_defaults = {k: configs.check(k, v) for k, v in (topic_defaults or {}).items()}
        configs.to_log_config(self.topic_defaults)  # ConfigError now, not at the first topic
        self.broker_configs = dict(broker_configs or {})
        self.advertise = advertise
        if (tls_cert is None) != (tls_key is None):
            raise InvalidArgumentError("TLS needs both a certificate and its key (--tls-cert, --tls-key)")
        # loopback only, unless TLS and SASL users are both given (security.py)
        security.check_listen(host, tls_cert is not None, users is not None)
        self.tls = security.tls_context(tls_cert, tls_key) if tls_cert and tls_key else None
        self.users = security.Users(users) if users is not None else None
        self.users_path = users or os.path.join(self.root, scram_admin.ROOT_USERS_FILE)  # (scram_admin.py)
        self.anonymous = self._anonymous() if users is None else None
        if data_mode not in security.DATA_MODES:
            raise InvalidArgumentError(f"data mode {data_mode!r}: use one of {', '.join(security.DATA_MODES)}")
        self.data_mode = data_mode
        self._umask: int | None = None
        self.logins = security.Logins(failed_auth_delay, max_failed_logins, failed_login_window)
        self.broker: Broker | None = None
        self.coordinator: GroupCoordinator | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._busy: set[asyncio.Task[Any]] = set()
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.fetch_max_bytes = fetch_max_bytes
        self.max_decompressed_bytes = max_decompressed_bytes
        self._pool = Pool(queued_max_request_bytes)
        self._responses = Pool(2 * fetch_max_bytes)  # Fetch responses built and being written
        self._servers: list[asyncio.base_events.Server] = []
        self._open = 0  # accepted sockets not yet closed, in all and per IP address
        self._open_per_ip: collections.Counter[str] = collections.Counter()
        self._refused = 0  # connections refused since the last log line about them
        self._refused_logged = -REFUSED_LOG_INTERVAL
        self._stopping = False
        self.fetch_sessions = FetchSessions(fetch_session_slots)
        self.topic_ids = topic_ids.TopicIds()

    async def start(self) -> None:
        """Open the data root and listen."""
        self._umask = security.protect_root(self.root, self.data_mode)  # files 0600, dirs 0700
        try:
            self.broker = Broker(self.root, self.host, self.port, auto_create=self.auto_create,
                                 max_decompressed_bytes=self.max_decompressed_bytes,
                                 fetch_max_bytes=self.fetch_max_bytes, fence_backoff=self.fence_backoff,
                                 auto_create_per_request=self.auto_create_per_request,
                                 auto_create_rate=self.auto_create_rate)
            try:
                for sock in self._listen():
                    self._servers.append(await asyncio.start_server(
                        self._connection, sock=sock, limit=1 << 16, ssl=self.tls,
                        ssl_handshake_timeout=self.request_timeout if self.tls else None))
            except BaseException:
                for srv in self._servers:
                    srv.close()
                self.broker.close()
                self.broker = None
                raise
        except BaseException:
            os.umask(self._umask)
            self._umask = None
            raise
        self._server = self._servers[0]
        self.port = self.broker.port = self._server.sockets[0].getsockname()[1]
        self.broker.responses = self._responses
        self.broker.default_partitions = self.num_partitions
        self.broker.topic_defaults = self.broker.settings.defaults = self.topic_defaults
        self.broker.broker_configs = self.broker_configs
        broker_alter.restore(self.broker)  # the broker configs changed over the Admin API
        if self.advertise:  # what Metadata and FindCoordinator tell clients (a proxy, a NAT)
            host, _, port = self.advertise.rpartition(":")
            self.broker.advertised_host, self.broker.port = host or self.host, int(port)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY and soft < self.max_connections + 100:
            log.warning("the open files limit (%d) is below max.connections (%d) + 100: connections are refused "
                        "when descriptors run out (raise ulimit -n, or lower --max-connections)",
                        soft, self.max_connections)
        if self.metrics_port is not None:
            from pylog.serve.metrics import Metrics  # prometheus_client: only when asked for

            metrics = Metrics(self)
            try:
                self.metrics_port = metrics.start(self.metrics_host, self.metrics_port)
            except BaseException:
                await self.stop()
                raise
            self.metrics = metrics
        self.coordinator = GroupCoordinator(self.broker)
        self.coordinator.start()
        self.broker.txns = TxnCoordinator(self.broker, self.coordinator, self.txn_limits)  # (txn_coordinator.py)
        self.broker.txns.start()
        if self.cleanup_interval is not None:
            self._cleaner = asyncio.create_task(self._cleanup_loop(self.cleanup_interval))
        if self.cleaner_backoff is not None:  # compaction when due (cleaner.py), between those runs
            self._compactor = asyncio.create_task(self._compaction_loop(self.cleaner_backoff))
        log.info("pylog serve: listening on %s:%d, root %s", self.host, self.port, self.root)

    @property
    def open_connections(self) -> int:
        """Client connections accepted and not yet closed."""
        return self._open

    def _listen(self) -> list[_Listener]:
        """Listening sockets on every address of ``host`` (as asyncio.start_server binds
        them; with port 0 the first one's port for all), refusing at accept what is over
        the connection limits."""
        socks: list[_Listener] = []
        port = self.port
        try:
            for family, kind, proto, _, addr in dict.fromkeys(
                    socket.getaddrinfo(self.host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
                sock = _Listener(family, kind, proto)
                socks.append(sock)
                sock.admit, sock.refuse = self._admit, self._refuse
                sock.spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((addr[0], port, *addr[2:]))
                port = sock.getsockname()[1]
                sock.listen(100)
                sock.setblocking(False)
        except BaseException:
            for sock in socks:
                sock.close()
            raise
        return socks

    def _admit(self, ip: str) -> Any:
        """At accept: a callable that gives the connection's place back when it closes,
        or None when ``ip`` is over a limit (the connection is then closed, unread)."""
        if self._stopping:
            return None
        if self._open >= self.max_connections:
            self._refuse(f"max.connections ({self.max_connections}) reached")
            return None
        if self._open_per_ip[ip] >= self.max_connections_per_ip:
            self._refuse(f"max.connections.per.ip ({self.max_connections_per_ip}) reached by {ip}")
            return None
        self._open += 1
        self._open_per_ip[ip] += 1

        def closed() -> None:
            self._open -= 1
            self._open_per_ip[ip] -= 1
            if not self._open_per_ip[ip]:
                del self._open_per_ip[ip]
        return closed

    def _refuse(self, why: str) -> None:
        """Count a refused connection; log at most one line per :data:`REFUSED_LOG_INTERVAL`."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= REFUSED_LOG_INTERVAL:
            log.warning("refusing connections: %s (%d refused since the last such line)", why, self._refused)
            self._refused, self._refused_logged = 0, now

    async def _cleanup_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.broker is not None:
                await self.broker.run_cleanup()

    async def _compaction_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if self.broker is not None:
                await self.broker.admin(self.broker.cleaner.run)

    async def stop(self) -> None:
        """Stop listening, let requests in flight finish, close connections, close the logs.
        A request that arrives meanwhile closes its connection unanswered; long polls are
        answered at once with what they have."""
        self._stopping = True
        for srv in self._servers:
            srv.close()
        if self.broker is not None:
            self.broker.closing = True
            self.broker.notify()
        if self.coordinator is not None:  # answers the joins and syncs that wait
            await self.coordinator.close()
        if self.broker is not None and self.broker.txns is not None:
            await self.broker.txns.close()
        for task in (self._cleaner, self._compactor):
            if task is not None:
                task.cancel()
                await asyncio.wait({task}, timeout=self.request_timeout)
        if self._busy:
            await asyncio.wait(set(self._busy), timeout=self.request_timeout)
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.wait(set(self._conns), timeout=5)
        if self.metrics is not None:  # (its HTTP thread reads the broker)
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.stop)
            self.metrics = None
        if self.broker is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.broker.close)
            self.broker = None
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    async def _read_frame(self, reader: asyncio.StreamReader) -> tuple[bytearray, int] | None:
        """The next request frame (after its size) and the pool bytes it holds (to give
        back once handled), or None: the client left, was silent for ``idle_timeout``,
        took over ``request_timeout`` for the size or the body, or sent a size over
        ``max_request_bytes``."""
        try:
            first = await asyncio.wait_for(reader.readexactly(1), self.idle_timeout)
            # from its first byte on, the size is part of a request: the request timeout
            head = first + await asyncio.wait_for(reader.readexactly(3), self.request_timeout)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            return None
        (size,) = _SIZE.unpack(head)
        if size < 8 or size > self.max_request_bytes:
            log.info("closing a connection: a request frame of %d bytes (limit %d)", size, self.max_request_bytes)
            return None
        held = size if size > SMALL_FRAME else 0
        if held:  # nothing more is read from this socket until the pool has room
            await self._pool.take(held)
        try:
            body = await asyncio.wait_for(self._read_body(reader, size), self.request_timeout)
        except (asyncio.TimeoutError, ConnectionError):
            body = None
        except BaseException:
            self._pool.give(held)
            raise
        if body is None:
            self._pool.give(held)
            return None
        return body, held

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, size: int) -> bytearray | None:
        """``size`` bytes into one buffer, as they arrive (no second copy of the whole); None
        when the client leaves first. However it ends early (also a timeout's cancel), the
        buffer is dropped here: an exception's traceback would keep it alive until the
        garbage collector breaks the task's reference cycle."""
        buf = bytearray(size)
        view = memoryview(buf)
        pos = 0
        try:
            while pos < size:
                chunk = await reader.read(min(size - pos, READ_STEP))
                if not chunk:
                    break
                view[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
        finally:
            view.release()
            if pos < size:
                buf = bytearray()
        return buf if pos == size else None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        PEER.set(writer.get_extra_info("peername"))
        session = security.Session(tls=self.tls is not None, logins=self.logins, peer=writer.get_extra_info("peername"))
        security.SESSION.set(session)
        hold = [0]  # response bytes of the current request (pool.py), given back once written
        RESPONSE_HOLD.set(hold)
        try:
            while True:
                got = await self._read_frame(reader)
                if got is None or self._stopping:  # stopping: closed, unanswered (stop())
                    if got is not None:
                        self._pool.give(got[1])
                    break
                frame, held = got
                self._busy.add(task)
                try:
                    try:  # _handle frees the frame's memory once decoded
                        out = await self._handle(frame)
                    finally:
                        self._pool.give(held)
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
                    if hold[0]:
                        self._responses.give(hold[0])
                        hold[0] = 0
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

    async def _handle(self, frame: bytearray) -> Any:
        """The response frame of one request, None (acks=0) or False (close the connection).
        The frame's memory is freed once it is decoded (the request holds copies of what
        it needs)."""
        view = memoryview(frame).toreadonly()
        try:
            req = decode_request(view)
        except RequestError as e:
            log.info("closing a connection: %s", e)
            return False
        finally:
            view.release()
            try:
                frame.clear()
            except BufferError:  # a view of it still held: freed with the request instead
                pass
        if req.body is None:  # ApiVersions at a version not served: answered at v0
            keys = handlers.api_versions(self.broker, None, 0)["api_keys"]
            payload = build(req.response_cls, {"error_code": UNSUPPORTED_VERSION, "api_keys": keys})
            return encode_response(req, payload)
        metrics = self.metrics
        if metrics is None:
            return await self._dispatch(req)
        t = time.perf_counter()
        try:
            return await self._dispatch(req)
        finally:
            metrics.request(req.api_key, time.perf_counter() - t)

    def _client(self, user: str | None) -> str:
        """Who a request comes from, for the bounds per client: the SASL user, else the
        connection's IP address."""
        if self.users is not None and user is not None:
            return f"User:{user}"
        peer = PEER.get()
        return f"IP:{peer[0]}" if isinstance(peer, tuple) and peer else "IP:?"

    def _anonymous(self) -> security.Users | None:
        """Without --users: the data root's ACL bindings for ANONYMOUS, None if none."""
        users = security.Users(self.users_path, anonymous=True)
        return users if users.rules else None

    def _security_admin(self, key: int, body: Any, user: str | None) -> dict[str, Any]:
        """SCRAM credentials and ACLs in the users file, reloaded after a change."""
        path = self.users_path
        if key == 50:
            return scram_admin.describe(path, self.users, user, body)
        if key == 29:
            return acl_admin.describe_acls(path, self.users, user, body)
        fn = {51: scram_admin.alter, 30: acl_admin.create_acls, 31: acl_admin.delete_acls}[key]
        data, changed = fn(path, self.users, user, body)
        if changed and self.users is not None:
            self.users = security.Users(path)  # for the next logins and requests
        elif changed:
            self.anonymous = self._anonymous()
        return data

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
                data, session.close_after = await session.authenticate(users, body)
                if session.close_after and not session.locked_out:  # (a locked-out address: logged once)
                    log.info("SASL %s from %s failed: %s", session.mechanism, PEER.get(), data.get("error_message"))
                elif session.user is not None:
                    log.info("SASL %s from %s: user %r", session.mechanism, PEER.get(), session.user)
            return encode_response(req, build(req.response_cls, data))
        user = session.user if session is not None else None
        if users is not None and user is None and key != 18:
            log.info("closing a connection: API key %d before SASL authentication", key)
            return False
        if users is None and self.anonymous is not None:  # ACL bindings without SASL: Kafka's ANONYMOUS
            users, user = self.anonymous, "ANONYMOUS"
        unknown: topic_ids.Unknown | None = None  # Produce/Fetch by topic ids: the ids not known
        if key in topic_ids.ID_VERSION and req.api_version >= topic_ids.ID_VERSION[key]:
            try:
                body, unknown = await self.topic_ids.by_name(broker, key, body)
            except Exception:
                log.exception("request %s v%d: resolving its topic ids failed; closing its connection",
                              key, req.api_version)
                return False
        denied: acl.Denied = []
        refused: dict[str, Any] | None = None  # the answer to a request refused as a whole
        if users is not None:
            body, denied, refused = acl.filter_request(users, user, key, body, req.api_version)
        try:
            if refused is not None:
                data = refused
            elif key == 0:
                data = await broker.produce(body, req.api_version)
                if self.metrics is not None:
                    self.metrics.produced(body, data)
                if body.acks == 0:
                    return None
            elif key == 1:  # through the fetch session cache (KIP-227)
                data = await self.fetch_sessions.fetch(broker, body, req.api_version)
                if self.metrics is not None:
                    self.metrics.fetched(data)
            elif key in GROUP_KEYS and self.coordinator is not None:
                data = await self.coordinator.handle(key, body, req.api_version, req.client_id)
            elif key == 3 and users is not None:  # auto-creation needs the write permission
                data = await broker.admin(handlers.metadata, broker, body, req.api_version,
                                          lambda name: users.may(user, name, True))
            elif key == 18:
                data = handlers.api_versions(broker, body, req.api_version)
            elif key in (29, 30, 31, 50, 51):  # ACLs, SCRAM credentials (the users file)
                data = await broker.admin(self._security_admin, key, body, user)
            elif key in handlers.HANDLERS:  # the admin APIs: in an admin thread, never on the loop
                by = (self._client(user),) if key in txn_handlers.BY_CLIENT else ()  # (txn_limits.py)
                data = await broker.admin(handlers.HANDLERS[key], broker, body, req.api_version, *by)
            else:  # the next step's APIs: every error code says UNSUPPORTED_VERSION
                data = {}
            if key == 3:  # KIP-430's authorized operations, when asked for
                authorized.fill_metadata(data, body, req.api_version, users, user)
            if users is not None:
                acl.add_denied(data, denied)
                acl.filter_response(users, user, key, data, body, req.api_version)
            if unknown is not None:  # (the rights check's rows too)
                self.topic_ids.to_ids(key, data, unknown)
            return encode_response(req, build(req.response_cls, data,
                                              0 if key in SERVED else UNSUPPORTED_VERSION))
        except Exception:
            log.exception("request %s v%d failed; closing its connection", key, req.api_version)
            return False


def serve(root: str, host: str = "127.0.0.1", port: int = 9092, ready: Any = None, **options: Any) -> None:
    """Run a broker until SIGTERM or SIGINT, then stop it cleanly (requests in flight are
    answered, logs flushed and closed). ``ready(server)`` is called once it listens. The
    soft limit of open files is first raised to the hard limit, and large freed buffers
    are returned to the kernel (:func:`return_freed_buffers`)."""

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return_freed_buffers()
    old, new = raise_open_files_limit()
    if new != old:
        log.info("open files limit (RLIMIT_NOFILE) raised from %d to %d", old, new)

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
