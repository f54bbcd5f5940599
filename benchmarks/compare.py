"""``python -m benchmarks.compare [ARGS]``: kept for the commands in docs and notes.

The comparison lives in the package (:mod:`pylog.bench`, one module per peer), so it runs from
an installed pylog too: ``pylog bench --compare [ARGS]``.
"""
import sys

from pylog.bench.common import *  # noqa: F401,F403  (Row, Target, System, dataset_values, ...)
from pylog.bench.compare import *  # noqa: F401,F403
from pylog.bench.compare import main
from pylog.bench.peer_file import FileMmapScan, FileSystem  # noqa: F401
from pylog.bench.peer_lmdb import LmdbSystem  # noqa: F401
from pylog.bench.peer_pylog import PylogSystem  # noqa: F401
from pylog.bench.peer_queuelib import QueuelibSystem  # noqa: F401
from pylog.bench.peer_redis import RedisSystem  # noqa: F401
from pylog.bench.peer_rocksdict import RocksdictSystem  # noqa: F401
from pylog.bench.peer_sqlite import SqliteSystem  # noqa: F401

if __name__ == "__main__":
    sys.exit(main(prog="python -m benchmarks.compare"))
