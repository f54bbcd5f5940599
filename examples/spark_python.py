"""The Python that Spark starts for its workers, connecting back to the JVM before importing.

    python examples/spark_python.py -m MODULE [ARGS...]      (as Spark runs ``$PYSPARK_PYTHON``)

Spark starts most of its Python processes through one forking daemon, but the driver-side
process of a Python streaming source (``pyspark.sql.streaming.python_streaming_source_runner``)
is started on its own, and the JVM gives it a fixed 10 s, not configurable in Spark 4.3, to
connect back: ``Selector.select(10000)`` in ``PythonWorkerFactory.createSimpleWorker``, then
"Python worker failed to connect back". That module first imports pyspark.sql, pyarrow and
numpy (about 0.9 s of CPU), and only then connects; on a starved machine this takes longer
than 10 s and the streaming query fails.

This launcher connects first. When the JVM waits for this process to connect back (it passed
``PYTHON_WORKER_FACTORY_PORT`` or ``PYTHON_WORKER_FACTORY_SOCK_PATH``), it connects and
authenticates at once (the standard library's ``socket`` alone, a few milliseconds), then
imports the module and runs it as ``python -m`` would, handing it the socket it already has
instead of letting pyspark open a second one. The JVM accepts the connection within its 10 s
and then waits, without a deadline, for the process id the module sends once it runs. Every
other start (the daemon, whose workers connect within 60 s) runs the module unchanged.

Any other command line (Spark's shell scripts run ``$PYSPARK_PYTHON script.py``) runs the
interpreter as it is. Only the first connection is handed over; the process keeps its pid (the JVM checks it).
``pipeline.py`` points ``PYSPARK_PYTHON`` at a two-line shell script that runs this file with
the job's own interpreter and ``-S``: site-packages are added (``site.main()``) here, before
the connection but without Python's other start-up work, so the process connects after about
0.1 s of CPU instead of 0.9 s. The handover replaces a pyspark internal
(``pyspark.worker_util.local_connect_and_auth``): it is done only on the pyspark versions in
:data:`TESTED` (read from pyspark's ``version.py``, not imported); on others the module runs
unchanged.
"""
from __future__ import annotations

import os
import runpy
import socket
import struct
import sys


def connect_early() -> tuple[object, socket.socket] | None:
    """Connect and authenticate to the JVM waiting for this process; None if it is not waiting."""
    path = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    port = os.environ.get("PYTHON_WORKER_FACTORY_PORT")
    secret = os.environ.get("PYTHON_WORKER_FACTORY_SECRET")
    buffer_size = int(os.environ.get("SPARK_BUFFER_SIZE", 65536))
    if path and secret is None:  # a Unix socket: no secret
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    elif port and secret is not None:
        host = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        sock = socket.create_connection((host, int(port)))
        data = secret.encode()
        sock.sendall(struct.pack("!i", len(data)) + data)
        (n,) = struct.unpack("!i", _recv_exactly(sock, 4))
        reply = _recv_exactly(sock, n)
        if reply != b"ok":
            sock.close()
            raise SystemExit(f"spark_python: the JVM refused this worker's secret ({reply!r})")
    else:
        return None
    sock.settimeout(int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15)))
    return sock.makefile("rwb", buffer_size), sock


#: pyspark versions (major.minor) whose worker start this launcher was tested with; on any
#: other, every start runs the module unchanged (pyspark connects as usual)
TESTED = ("4.2", "4.3")


def _pyspark_version() -> str | None:
    """pyspark's major.minor, read from its version.py without importing pyspark; None if not found."""
    for d in sys.path:
        try:
            with open(os.path.join(d or ".", "pyspark", "version.py")) as f:
                text = f.read()
        except OSError:
            continue
        start = text.find("__version__")
        if start < 0:
            return None
        quoted = text[start:].split("=", 1)[1].strip().strip("'\"")
        return ".".join(quoted.split(".")[:2])
    return None


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SystemExit("spark_python: the JVM closed the connection while authenticating")
        buf += chunk
    return buf


def main() -> None:
    """Run ``-m MODULE ARGS...`` as ``python -m`` would, connected first where the JVM waits."""
    if len(sys.argv) < 3 or sys.argv[1] != "-m":  # e.g. Spark's scripts running a file: plain Python
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    module, args = sys.argv[2], sys.argv[3:]
    if sys.flags.no_site:  # started with -S: site-packages (and their .pth files) now, cheaply
        import site

        site.main()
    # the handover replaces a pyspark internal: only on the pyspark versions it was tested with
    early = connect_early() if module != "pyspark.daemon" and _pyspark_version() in TESTED else None
    if early is not None:
        import pyspark.worker_util as worker_util  # where get_sock_file_to_executor looks it up

        original = worker_util.local_connect_and_auth
        handed = [early]

        def local_connect_and_auth(conn_info: object, auth_secret: object) -> tuple[object, socket.socket]:
            """The connection made above the first time, then pyspark's own."""
            return handed.pop() if handed else original(conn_info, auth_secret)

        worker_util.local_connect_and_auth = local_connect_and_auth  # type: ignore[assignment]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
