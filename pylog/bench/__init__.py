"""The comparison benchmark: pylog against the stores a user would pick instead.

``pylog bench --compare`` (or ``python -m pylog.bench``) runs :func:`pylog.bench.compare.main`.
One module per peer (``peer_pylog``, ``peer_file``, ``peer_sqlite``, ``peer_lmdb``,
``peer_rocksdict``, ``peer_queuelib``, ``peer_redis``), each a :class:`~pylog.bench.common.System`;
the peers' packages come with the ``bench`` extra, and a peer that is not installed is
skipped. Nothing here is imported by ``import pylog``.
"""
