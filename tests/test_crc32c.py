"""CRC32C: the C core's four paths against the pure-Python oracle and the crc32c package."""
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pylog
from pylog import _pure

native = pytest.importorskip("pylog._native") if pylog.backend == "native" else None
needs_native = pytest.mark.skipif(native is None, reason="the C core is not in use")

# RFC 3720 (iSCSI) B.4 test vectors, plus the standard check value.
VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0x00000000),
]


@pytest.mark.parametrize("data,expected", VECTORS)
def test_vectors_pure(data, expected):
    assert _pure.crc32c(data) == expected


@needs_native
@pytest.mark.parametrize("fn", ["crc32c", "crc32c_portable", "crc32c_hw", "crc32c_clmul"])
@pytest.mark.parametrize("data,expected", VECTORS)
def test_vectors_native(fn, data, expected):
    assert getattr(native, fn)(data) == expected


def test_public_crc32c():
    assert pylog.crc32c(b"123456789") == 0xE3069283
    assert pylog.crc32c(b"6789", pylog.crc32c(b"12345")) == 0xE3069283


@needs_native
@given(st.binary(max_size=3000), st.integers(0, 15))
def test_every_alignment_matches_oracle(data, skip):
    buf = bytearray(16) + bytearray(data)
    view = memoryview(buf)[skip : skip + len(data)]
    want = _pure.crc32c(bytes(view))
    assert native.crc32c(view) == want
    assert native.crc32c_portable(view) == want
    assert native.crc32c_hw(view) == want
    assert native.crc32c_clmul(view) == want


@needs_native
def test_long_buffers_cross_the_interleaved_blocks():
    # 3 x 8 KiB and 3 x 256 B blocks, and every tail length around them
    import crc32c as ref  # the crc32c package: an independent implementation

    data = os.urandom(3 * 8192 * 2 + 3 * 256 * 2 + 64)
    for n in list(range(0, 40)) + [767, 768, 769, 24575, 24576, 24577, len(data)]:
        for off in (0, 1, 7):
            chunk = data[off : off + n]
            assert native.crc32c(chunk) == ref.crc32c(chunk) == native.crc32c_portable(chunk)


# The x86-64 folding path's fused block: 32 KiB folded while three crc32 streams take 8 KiB each.
FUSED = 32768 + 3 * 8192


@needs_native
def test_folding_path_crosses_its_steps_and_fused_blocks():
    """The carry-less multiply path (the dispatcher's choice on x86-64 with VPCLMULQDQ)
    against the crc32c package at every boundary it has: 256 bytes (where folding starts),
    128-byte steps, fused blocks and what follows them. Where the CPU has no VPCLMULQDQ
    (ARM, older x86) this checks the crc32-instruction path at the same sizes instead; the
    test of the environment variables checks which path a CPU gets."""
    import crc32c as ref

    data = os.urandom(3 * FUSED + 512)
    sizes = [255, 256, 257, 383, 384, 385, 511, 512, 4096 + 15, FUSED - 129, FUSED - 1, FUSED,
             FUSED + 1, FUSED + 127, FUSED + 255, FUSED + 256, FUSED + 257, 2 * FUSED, 2 * FUSED + 383,
             3 * FUSED, len(data) - 7]
    for n in sizes:
        for off in (0, 1, 5, 8):
            chunk = memoryview(data)[off : off + n]
            want = ref.crc32c(chunk)
            assert native.crc32c_clmul(chunk) == want, (n, off)
            assert native.crc32c(chunk) == want, (n, off)
            seed = 0x9E3779B9
            assert native.crc32c_clmul(chunk, seed) == ref.crc32c(chunk, seed), (n, off)


@needs_native
@given(st.integers(0, 3 * FUSED), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 31))
def test_folding_path_matches_the_crc32_instructions(n, seed, start, skip):
    """Any length up to three fused blocks, any starting value, any alignment: the folding
    path, the crc32-instruction path and the portable one agree, and continuing a CRC over
    a split gives the CRC of the whole."""
    data = random.Random(seed).randbytes(n + skip)
    view = memoryview(data)[skip:]
    want = native.crc32c_portable(view, start)
    assert native.crc32c_clmul(view, start) == want
    assert native.crc32c_hw(view, start) == want
    cut = seed % (n + 1)
    assert native.crc32c_clmul(view[cut:], native.crc32c_clmul(view[:cut], start)) == want


@needs_native
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_incremental_equals_whole(parts):
    c = 0
    for p in parts:
        c = native.crc32c(p, c)
    assert c == native.crc32c(b"".join(parts))


@given(st.binary(max_size=2000), st.data())
def test_batch_matches_single(buf, data):
    n = data.draw(st.integers(0, 10))
    pos = [data.draw(st.integers(0, len(buf))) for _ in range(n)]
    lens = [data.draw(st.integers(0, len(buf) - p)) for p in pos]
    out = pylog._backend.impl.crc32c_batch(buf, pos, lens)
    assert out.tolist() == [_pure.crc32c(buf[p : p + n]) for p, n in zip(pos, lens)]


def test_batch_rejects_ranges_outside_the_buffer():
    with pytest.raises(ValueError):
        pylog._backend.impl.crc32c_batch(b"abc", [2], [5])


def test_tables_are_generated_from_the_generator():
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("gen_tables", os.path.join(root, "csrc", "gen_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(os.path.join(root, "csrc", "crc32c_tables.h")) as f:
        assert f.read() == mod.render()


def _cpu_has_clmul() -> bool | None:
    """What the kernel says about the folding path's instructions (x86-64 Linux), read
    independently of the C core's own detection; None where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    return os.uname().machine == "x86_64" and {"sse4_2", "pclmulqdq", "avx2", "vpclmulqdq"} <= set(flags)


@needs_native
def test_force_portable_and_no_clmul_environment_variables():
    code = "import pylog._native as n; print(n.crc_impl(), hex(n.crc32c(b'123456789')))"
    env = dict(os.environ, PYLOG_CRC32C_FORCE_PORTABLE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["portable", "0xe3069283"]
    env.pop("PYLOG_CRC32C_FORCE_PORTABLE")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    impl = out.stdout.split()[0]
    kernel_says = _cpu_has_clmul()
    if kernel_says is not None:  # else only the C core's own word is there to go by
        assert native.crc_clmul_available() == kernel_says
    x86 = "sse4.2+vpclmulqdq" if native.crc_clmul_available() else "sse4.2"
    hw = {"x86_64": x86}.get(os.uname().machine, "armv8-crc")
    assert impl == ("portable" if not native.crc_hw_available() else hw)
    env["PYLOG_CRC32C_NO_CLMUL"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    without = "portable" if not native.crc_hw_available() else {"x86_64": "sse4.2"}.get(os.uname().machine, "armv8-crc")
    assert out.stdout.split() == [without, "0xe3069283"]


@needs_native
@given(st.lists(st.tuples(st.binary(max_size=3000), st.integers(0, 7)), min_size=3, max_size=3))
def test_three_at_once_matches_single(parts):
    """The C core's interleaved three-buffer CRC (batch framing's) equals three single ones
    of the pure backend, for unequal lengths and unaligned starts."""
    bufs = [memoryview(b"\0" * off + data)[off:] for data, off in parts]
    want = tuple(_pure.crc32c(bytes(b)) for b in bufs)
    assert native.crc32c_3(*bufs) == want


@needs_native
def test_three_at_once_on_long_equal_buffers():
    bufs = [os.urandom(n) for n in (24577, 24577, 24577)]
    assert native.crc32c_3(*bufs) == tuple(native.crc32c_portable(b) for b in bufs)
