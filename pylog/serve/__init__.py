"""``pylog serve``: a broker that speaks Kafka's wire protocol over a data root.

Layout (docs/serve.md): :mod:`.server` (asyncio listener, one coroutine per connection),
:mod:`.protocol` (framing, kio schemas, the version-independent response builder),
:mod:`.handlers` (one function per API), :mod:`.broker` (the partitions, Produce, Fetch),
:mod:`.records` (RecordBatch v2 <-> pylog records through the C core), :mod:`.configs`
(Kafka topic config names <-> LogConfig), :mod:`.headers` (Kafka headers in metadata; needs
nothing else), :mod:`.pool` (the byte pools that bound what is held for clients), :mod:`.fencing` (the
gate that orders a partition's appends, and the fence after a failed write),
:mod:`.admin_cluster` (DescribeCluster, DescribeLogDirs), :mod:`.metrics` (the Prometheus
endpoint; needs ``prometheus_client``, imported only when it is asked for). The rest
needs the ``serve`` extra (kio and the codecs), imported on first use.
"""
from __future__ import annotations

from typing import Any

__all__ = ["Server", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        try:
            import kio  # noqa: F401
        except ImportError:
            from pylog.errors import MissingExtraError

            raise MissingExtraError("pylog serve", "kio", "serve") from None
        from pylog.serve import server

        return getattr(server, name)
    raise AttributeError(f"module 'pylog.serve' has no attribute {name!r}")
