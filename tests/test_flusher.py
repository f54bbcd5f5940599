"""The background flusher thread (pylog/flusher.py) under concurrent opens and closes."""
from __future__ import annotations

from conftest import run_py


def test_flusher_survives_logs_opened_and_closed_by_other_threads():
    """Logs registered and unregistered while the flusher thread walks the registry must
    not kill the thread (found by the store model test: 'Set changed size during
    iteration' in pylog-flusher, after which no log of the process was flushed by its
    flush_ms timer any more). A tiny GIL switch interval makes the race show within a
    second on the old code."""
    r = run_py("""
        import sys, time
        sys.setswitchinterval(1e-6)
        from pylog import flusher

        class Dummy:
            def _timer_flush(self, now_ms): pass
            def write_out(self): pass

        keep = [Dummy() for _ in range(20000)]
        for d in keep:
            flusher.register(d)
        extra = [Dummy() for _ in range(100)]
        stop = time.monotonic() + 4
        rounds = 0
        while time.monotonic() < stop and flusher._thread.is_alive():
            for d in extra:
                flusher.register(d)
            for d in extra:
                flusher.unregister(d)
            rounds += 1
        print("alive" if flusher._thread.is_alive() else "dead", rounds)
    """)
    assert r.returncode == 0, r.stderr
    state, rounds = r.stdout.split()
    assert int(rounds) > 0
    assert state == "alive", r.stderr[-500:]
