"""Write the format v1 test vectors (tests/data/vectors/) with an encoder independent of
pylog: plain struct and a bit-at-a-time CRC32C. Run once; the output is committed, and
tests/test_vectors.py decodes it with pylog. See docs/vectors.md for provenance."""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors")
BASE = 100


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def header(magic: bytes, base: int) -> bytes:
    h = struct.pack("<8sHHIQI", magic, 1, 32, 0, base, 0)
    return h + struct.pack("<I", crc32c(h))


RECORDS = [  # (timestamp, key, metadata, value); None = null
    (1700000000000, None, None, b"hello"),
    (1700000000001, b"user-42", None, b"{\"amount\": 12}"),
    (1700000000001, b"k", b"trace=abc", b""),
    (1700000000500, b"tomb", None, None),
    (1700000001000, None, b"m", bytes(range(256))),
]


def frame(offset, ts, key, meta, value):
    attrs = (key is None) | (meta is None) << 1 | (value is None) << 2
    k, m, v = key or b"", meta or b"", value or b""
    rest = struct.pack("<QqIII", offset, ts, attrs, len(k), len(m)) + k + m + v
    return struct.pack("<II", len(rest), crc32c(rest)) + rest


def main():
    os.makedirs(HERE, exist_ok=True)
    store = header(b"PYLOGSTO", BASE)
    index = header(b"PYLOGIDX", BASE)
    tindex = header(b"PYLOGTIX", BASE)
    frames = []
    for i, (ts, k, m, v) in enumerate(RECORDS):
        pos = len(store)
        f = frame(BASE + i, ts, k, m, v)
        frames.append({"offset": BASE + i, "position": pos, "hex": f.hex()})
        if i % 2 == 0:  # a sparse index: every other record
            index += struct.pack("<II", i, pos)
            tindex += struct.pack("<qII", ts, i, pos)
        store += f
    name = f"{BASE:020d}"
    for suffix, data in ((".log", store), (".index", index), (".timeindex", tindex)):
        with open(os.path.join(HERE, name + suffix), "wb") as fh:
            fh.write(data)
    expected = {
        "base_offset": BASE,
        "records": [
            {"offset": BASE + i, "timestamp": ts,
             "key": None if k is None else k.hex(), "metadata": None if m is None else m.hex(),
             "value": None if v is None else v.hex()}
            for i, (ts, k, m, v) in enumerate(RECORDS)
        ],
        "frames": frames,
        "store_crc32c": crc32c(store),
    }
    with open(os.path.join(os.path.dirname(HERE), "vectors.json"), "w") as fh:
        json.dump(expected, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
