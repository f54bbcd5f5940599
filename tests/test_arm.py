"""Platform checks for the ARM (Raspberry Pi) runs of scripts/test-arm.sh.

The script runs the whole suite under qemu-user on several CPU models and tells this module
what it should find through environment variables:

* ``PYLOG_EXPECT_CRC_IMPL``: the CRC32C implementation the run must use (``armv8-crc`` on a
  CPU with the CRC extension, ``portable`` on cortex-a7 or with
  ``PYLOG_CRC32C_FORCE_PORTABLE=1``). Unset (a normal x86 run): those tests are skipped.

The rest runs everywhere: both CRC paths against the pure-Python oracle at every alignment,
and the 32-bit limits of LogConfig.
"""
from __future__ import annotations

import os
import platform
import random
import sys

import pytest

import pylog
from pylog import _pure
from pylog.config import LogConfig
from pylog.errors import ConfigError

EXPECT = os.environ.get("PYLOG_EXPECT_CRC_IMPL", "")
IS_32BIT = sys.maxsize < 2**32

needs_expectation = pytest.mark.skipif(
    not EXPECT, reason="PYLOG_EXPECT_CRC_IMPL unset (set by scripts/test-arm.sh per CPU model)")


def native():
    try:
        from pylog import _native
    except ImportError as e:  # pragma: no cover - a build without the C core
        pytest.skip(f"C core not built: {e}")
    return _native


@needs_expectation
def test_crc_impl_is_the_expected_one(record_property):
    """The run uses the CRC32C path the CPU model calls for: the hardware one when the
    CPU has it, the portable one on cortex-a7 or when forced."""
    n = native()
    impl = n.crc_impl()
    record_property("crc_impl", impl)  # scripts/test-arm.sh prints it in the summary line
    assert pylog.backend == "native", "the C core did not load: the run would test nothing of it"
    assert impl == EXPECT, f"{platform.machine()}: crc_impl() is {impl!r}, expected {EXPECT!r}"
    forced = os.environ.get("PYLOG_CRC32C_FORCE_PORTABLE") == "1"
    if EXPECT == "armv8-crc":
        assert n.crc_hw_available() and not forced
    elif not forced:
        assert not n.crc_hw_available(), "portable chosen although the CPU has CRC32C"
    assert "crc32c-" + impl in pylog.backend_features


@needs_expectation
def test_expected_impl_matches_the_machine():
    """armv8-crc is only ever expected (and so only ever proven) on ARM."""
    if EXPECT == "armv8-crc":
        assert platform.machine() in ("aarch64", "armv7l", "armv8l")


@pytest.mark.parametrize("which", ["dispatch", "portable", "hw"])
def test_crc_paths_agree_with_the_oracle_at_every_alignment(which):
    """The dispatched, portable and hardware entry points equal the pure-Python CRC32C at
    start addresses 0..15 and lengths that cross the 3-stream blocks of the hardware loop."""
    n = native()
    fn = {"dispatch": n.crc32c, "portable": n.crc32c_portable, "hw": n.crc32c_hw}[which]
    rnd = random.Random(7)
    data = bytes(rnd.getrandbits(8) for _ in range(3 * 8192 + 1024))
    mv = memoryview(data)
    assert fn(b"123456789") == 0xE3069283
    for start in range(16):
        for length in (0, 1, 7, 8, 9, 63, 255, 767, 768, 769, 3 * 8192 + 17):
            chunk = mv[start:start + length]
            assert fn(chunk) == _pure.crc32c(chunk), (which, start, length)
    # incremental
    assert fn(mv[100:], fn(mv[:100])) == fn(data)


def test_32bit_segment_limits():
    """On a 32-bit Python every mapping shares one small address space: the default segment
    is small, larger ones are refused with a clear error, and the mapped total stays bounded.
    On 64-bit, the 1 GiB default stands."""
    cfg = LogConfig()
    if IS_32BIT:
        assert cfg.segment_bytes <= 64 << 20
        with pytest.raises(ConfigError, match="32-bit"):
            LogConfig(segment_bytes=1 << 30)
        with pytest.raises(ConfigError, match="32-bit"):
            LogConfig(segment_bytes=256 << 20, cached_segments=16)
        LogConfig(segment_bytes=256 << 20, cached_segments=4)
    else:
        assert cfg.segment_bytes == 1 << 30
        LogConfig(segment_bytes=(1 << 32) - 1, cached_segments=16)
    LogConfig(segment_bytes=4096, cached_segments=None)


def test_large_offsets_survive_the_round_trip(tmp_path):
    """64-bit offsets above 2**32 (and timestamps above 2**31) go through C and back on
    every word size."""
    base = (1 << 40) + 5
    with pylog.Log(str(tmp_path / "l"), initial_offset=base, segment_bytes=4096, fsync="never") as log:
        ts = (1 << 41) + 3
        first = log.append_batch([b"a" * 100] * 100, timestamps=[ts] * 100)
        assert first == base
        assert log.next_offset == base + 100
        rec = log.read(base + 77)
        assert (rec.offset, rec.timestamp, bytes(rec.value)) == (base + 77, ts, b"a" * 100)
        assert [r.offset for r in log.read_batch(base + 98, max_bytes=1 << 20)] == [base + 98, base + 99]
