"""The broker's metrics on a Prometheus endpoint (``pylog serve --metrics-port``).

Each :class:`~pylog.serve.server.Server` with a metrics port has its own
:class:`Metrics`: its own ``CollectorRegistry`` (several brokers in one process do not
share or clash), served by a bounded HTTP server (:mod:`.metrics_http`) on loopback unless
the broker is given another ``metrics_host``, stopped with the broker. docs/serve.md, "Metrics", lists every metric.

The cost on the produce and fetch path is kept low: the event loop, the only thread that
counts requests and bytes, adds plain integers into dicts (no lock, no metric object per
call), and the scrape turns them into metric families (:class:`_Collector`). What is
computed per scrape instead, in the HTTP server's thread: open connections, fenced
partitions, and each consumer group's lag per partition (its committed offset, read from
the group's offset file, against the partition's high watermark). fsync latency is
observed through :func:`pylog.vfs.observe_syncs` (the log layer knows nothing of this
module); it covers every fsync of the process, also of other brokers or logs in it.
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from pylog import vfs
from pylog.consumer import decode_offset
from pylog.errors import PylogError
from pylog.serve.metrics_http import MetricsServer
from pylog.serve.protocol import SERVED
from pylog.serve.reads import RECORDS_KEY, batch_records
from pylog.topics import CONSUMERS_DIR

if TYPE_CHECKING:
    from pylog.serve.server import Server

__all__ = ["Metrics", "LATENCY_BUCKETS", "FSYNC_BUCKETS"]

#: Request latency buckets, seconds (from 0.5 ms to a long poll's 30 s).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: fsync latency buckets, seconds.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

class _Latency:
    """A histogram filled on the event loop only: no lock (see the module docstring)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0


class Metrics:
    """The metrics of one broker (``server``) and the HTTP endpoint that serves them.

    The counting methods (:meth:`request`, :meth:`produced`, :meth:`fetched`) are called by
    the server on its event loop; the rest is read at scrape time."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        #: topic -> [bytes in, records in, bytes out, records out]
        self.topics: dict[str, list[int]] = {}
        #: API key -> its latency histogram
        self.latency: dict[int, _Latency] = {}
        self.fsync = Histogram("pylog_fsync_seconds", "Seconds per fsync or fdatasync of the process's files",
                               buckets=FSYNC_BUCKETS, registry=self.registry)
        self.registry.register(_Collector(self))
        self._observe = self.fsync.observe
        self._httpd: MetricsServer | None = None
        self.port: int | None = None

    # -- on the event loop ------------------------------------------------------------------
    def request(self, key: int, seconds: float) -> None:
        """Count a request of API ``key`` that took ``seconds`` (read to answer)."""
        h = self.latency.get(key)
        if h is None:
            h = self.latency[key] = _Latency()
        h.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h.total += seconds

    def _topic(self, name: str) -> list[int]:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = [0, 0, 0, 0]
        return t

    def produced(self, req: Any, data: dict[str, Any]) -> None:
        """Count the record batches of a Produce request that were appended (their partition
        answered without an error): their bytes as sent, and their records."""
        responses = data.get("responses", ())
        if len(responses) != len(req.topic_data):  # a topic named twice: answered as one
            return self._produced_by_name(req, responses)
        # the broker answers each topic in the request's order, its partitions too
        for t, r in zip(req.topic_data, responses):
            c = None
            for p, answer in zip(t.partition_data, r["partition_responses"]):
                if not answer["error_code"] and p.records is not None:
                    if c is None:
                        c = self._topic(t.name)
                    c[0] += len(p.records)
                    c[1] += batch_records(p.records)

    def _produced_by_name(self, req: Any, responses: Any) -> None:
        ok = {(t["name"], p["index"]) for t in responses for p in t["partition_responses"] if not p["error_code"]}
        for t in req.topic_data:
            for p in t.partition_data:
                if p.records is not None and (t.name, p.index) in ok:
                    c = self._topic(t.name)
                    c[0] += len(p.records)
                    c[1] += batch_records(p.records)

    def fetched(self, data: dict[str, Any]) -> None:
        """Count the record batches of a Fetch response: their bytes, and their records as
        the fetch thread counted them (:data:`.reads.RECORDS_KEY`): the loop adds one
        integer per partition answered, it never walks the batches."""
        for t in data.get("responses", ()):
            c = None
            for p in t["partitions"]:
                rec = p.get("records")
                if rec:
                    if c is None:
                        c = self._topic(t["topic"])
                    c[2] += len(rec)
                    c[3] += p.get(RECORDS_KEY, 0)

    # -- the endpoint -----------------------------------------------------------------------
    def start(self, host: str, port: int) -> int:
        """Serve the registry over HTTP at ``host:port`` (0: a free port), bounded
        (:mod:`.metrics_http`); returns the port. fsync latency is observed from now on."""
        self._httpd = MetricsServer(host, port, self.registry)
        self._httpd.start()
        self.port = self._httpd.port
        vfs.observe_syncs(self._observe)
        return self.port

    def stop(self) -> None:
        """Stop observing fsyncs and serving (waits for the server's thread)."""
        vfs.unobserve_syncs(self._observe)
        if self._httpd is not None:
            self._httpd.stop()
            self._httpd = None


def _api_name(key: int) -> str:
    got = SERVED.get(key)
    return got[0] if got is not None else str(key)


class _Collector(Collector):
    """What a scrape computes (see the module docstring)."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Any]:
        """The metric families of one scrape."""
        m = self.m
        names = ("bytes_in", "records_in", "bytes_out", "records_out")
        helps = ("Record batch bytes appended by Produce requests (as the producers sent them)",
                 "Records appended by Produce requests",
                 "Record batch bytes sent in Fetch responses",
                 "Records sent in Fetch responses")
        fams = [CounterMetricFamily(f"pylog_topic_{n}", h, labels=["topic"]) for n, h in zip(names, helps)]
        for topic, counts in list(m.topics.items()):
            for fam, v in zip(fams, list(counts)):
                fam.add_metric([topic], v)
        yield from fams
        lat = HistogramMetricFamily("pylog_request_seconds", "Seconds from a request's decoding to its answer, "
                                    "per API (the count is the requests served)", labels=["api"])
        for key, h in sorted(m.latency.items()):
            counts, total = list(h.counts), h.total
            acc, buckets = 0, []
            for bound, c in zip((*(repr(b) for b in LATENCY_BUCKETS), "+Inf"), counts):
                acc += c
                buckets.append((bound, acc))
            lat.add_metric([_api_name(key)], buckets, total)
        yield lat
        server = m.server
        yield GaugeMetricFamily("pylog_connections", "Client connections open", value=server.open_connections)
        broker = server.broker
        now = broker.fenced_partitions if broker else []
        fenced = GaugeMetricFamily("pylog_fenced_partitions", "Partitions fenced after a failed write or fsync "
                                   "(appends refused until reopened)", value=len(now))
        yield fenced
        each = GaugeMetricFamily("pylog_partition_fenced", "1 for each fenced partition", labels=["topic", "partition"])
        for topic, i in sorted(now):
            each.add_metric([topic, str(i)], 1)
        yield each
        yield from self._lag(server)

    @staticmethod
    def _lag(server: Server) -> Iterator[Any]:
        """Per group and partition it committed an offset for: the committed offset and the
        lag (the high watermark minus the committed offset, or minus the log start when
        the commit is below it: what a consumer starting there has to read)."""
        lag = GaugeMetricFamily("pylog_group_lag", "Records between a group's committed offset and the "
                                "partition's high watermark", labels=["group", "topic", "partition"])
        committed = GaugeMetricFamily("pylog_group_committed_offset", "A group's committed offset",
                                      labels=["group", "topic", "partition"])
        broker = server.broker
        if broker is not None:
            for name in broker.store.topics():
                try:
                    topic = broker.topic(name)
                    gdir = os.path.join(topic.path, CONSUMERS_DIR)
                    groups = sorted(os.listdir(gdir)) if os.path.isdir(gdir) else []
                    n = topic.partitions
                except (PylogError, OSError):  # deleted meanwhile
                    continue
                for group in groups:
                    if "~" in group:  # a group being deleted or reset (groups.py)
                        continue
                    for i in range(n):
                        off = _read_committed(os.path.join(gdir, group, f"partition-{i}.offset"))
                        if off is None:
                            continue
                        ends = _ends(server, topic, name, i)
                        if ends is None:
                            continue
                        start, high = ends
                        labels = [group, name, str(i)]
                        committed.add_metric(labels, off)
                        lag.add_metric(labels, max(0, high - max(off, start)))
        yield lag
        yield committed


def _read_committed(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            return decode_offset(f.read(64))
    except (OSError, PylogError):
        return None


def _ends(server: Server, topic: Any, name: str, i: int) -> tuple[int, int] | None:
    """(log start, high watermark) of a partition: of the broker's writer when open (the
    watermark consumers see), else of a read-only Log."""
    broker = server.broker
    if broker is None:
        return None
    try:
        log = broker.ready(name, i)
        if log is not None:
            return log.start_offset, broker.visible_end(log, False, (name, i))
        log = topic.reader(i)
        if log.readonly:
            log.refresh()
        return log.start_offset, log.next_offset
    except (PylogError, OSError):
        return None

