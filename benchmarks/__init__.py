"""Benchmarks that are not part of the asv suite: ``python -m benchmarks.compare`` runs pylog
against its peers (see docs/benchmarks.md)."""
