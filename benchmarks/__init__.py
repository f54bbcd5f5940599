"""Benchmarks that are not part of the asv suite. The comparison with pylog's peers lives in the
package (:mod:`pylog.bench`, ``pylog bench --compare``); ``python -m benchmarks.compare`` is a
thin wrapper kept for the commands in docs and notes (see docs/benchmarks.md)."""
