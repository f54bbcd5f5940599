"""Read-only readers against a writer in another process: what a reader returns after the
writer truncated, rolled or rewrote the segments it had mapped. Real processes (``run_py``
children) over real files."""
from __future__ import annotations

from conftest import run_py

import pylog

#: A child that truncates the log at ``argv[2]`` and appends ``new-N`` records up to
#: offset 30 (the same sizes: the segments roll at the same offsets, under the same names).
REWRITE = """
import sys, pylog
with pylog.Log(sys.argv[1]) as w:
    w.truncate(int(sys.argv[2]))
    for i in range(int(sys.argv[2]), 30):
        w.append(b"new-%02d" % i + b"y" * 400)
"""


def _old_log(path):
    with pylog.Log(path, segment_bytes=4096, index_interval_bytes=0) as w:
        for i in range(30):
            w.append(b"old-%02d" % i + b"x" * 400)
        assert len(w.segments()) > 3  # offset 7 lies in a sealed segment


def test_readonly_refresh_after_truncate_elsewhere_returns_the_new_records(tmp_path):
    path = str(tmp_path / "log")
    _old_log(path)
    r = pylog.Log(path, readonly=True)
    assert bytes(r.read(7).value[:6]) == b"old-07"  # maps the first sealed segment
    assert bytes(r.read(20).value[:6]) == b"old-20"
    p = run_py(REWRITE, path, "5")
    assert p.returncode == 0, p.stderr
    r.refresh()
    want = [b"old-%02d" % i for i in range(5)] + [b"new-%02d" % i for i in range(5, 30)]
    assert [bytes(r.read(i).value[:6]) for i in range(30)] == want
    assert [bytes(x.value[:6]) for x in r.read_batch(0, max_records=30)] == want[: len(r.read_batch(0, max_records=30))]
    assert [bytes(x.value[:6]) for x in r.scan()] == want
    r.close()


def test_readonly_store_consumer_after_truncate_elsewhere(tmp_path):
    root = str(tmp_path / "root")
    with pylog.LogStore(root) as store:
        store.create_topic("t", segment_bytes=4096, index_interval_bytes=0)
        t = store.topic("t")
        for i in range(30):
            t.append(b"old-%02d" % i + b"x" * 400, partition=0)
    with pylog.LogStore(root, readonly=True) as ro:
        c = ro.consumer("t")
        got = [bytes(x.value[:6]) for x in c.poll(max_records=25)]
        assert got == [b"old-%02d" % i for i in range(25)]
        p = run_py(REWRITE, f"{root}/t/partition-0", "5")
        assert p.returncode == 0, p.stderr
        c.seek(0, 5)
        got = [bytes(x.value[:6]) for x in c.poll(max_records=100)]
        assert got == [b"new-%02d" % i for i in range(5, 30)]


#: A child that applies retention: the log keeps its last two segments.
RETENTION = """
import sys, pylog
with pylog.Log(sys.argv[1], retention_bytes=1) as w:
    assert w.enforce_retention() > 0
"""


def test_readonly_sizes_after_retention_elsewhere(tmp_path):
    path = str(tmp_path / "log")
    _old_log(path)
    r = pylog.Log(path, readonly=True)
    n = len(r._sealed) + 1  # not sized yet (segments() would size them)
    p = run_py(RETENTION, path)
    assert p.returncode == 0, p.stderr
    # the reader's listing still names the deleted segments: sizing them is no error
    assert len(r.segments()) == n and r.size_bytes > 0
    r.refresh()
    assert len(r.segments()) == 1 and r.start_offset == r.segments()[0]["base_offset"]
    r.close()


def test_readonly_refresh_with_a_listing_older_than_a_deletion(tmp_path, monkeypatch):
    """Retention elsewhere deletes a segment between a reader's listing and its look at the
    file: the refresh takes the listing as it is (the read of a deleted segment is out of
    range), it does not fail with FileNotFoundError."""
    path = str(tmp_path / "log")
    _old_log(path)
    r = pylog.Log(path, readonly=True)
    listed = r._list_bases()
    p = run_py(RETENTION, path)
    assert p.returncode == 0, p.stderr
    monkeypatch.setattr(r, "_list_bases", lambda: list(listed))
    r._sealed, r._sealed_bases = [], []  # none known yet: each is looked at
    r.refresh()
    assert [s["base_offset"] for s in r.segments()] == listed
    monkeypatch.undo()
    r.refresh()
    assert bytes(r.read(29).value[:6]) == b"old-29"
    r.close()


def test_readonly_verify_does_not_report_a_truncate_elsewhere_as_damage(tmp_path):
    """The reader knows segments [.., 18, 27); the writer then cuts the log inside segment
    18 (its store replaced by a shorter copy, 27 deleted): a verify that walks the new copy
    of 18 against the old listing must not report 'segment ends at offset 20, the next one
    starts at 27' on a healthy log (pylog verify would exit 1)."""
    path = str(tmp_path / "log")
    _old_log(path)
    r = pylog.Log(path, readonly=True)
    bases = r._sealed_bases
    assert len(bases) >= 3
    cut = bases[-1] + 2  # inside the last sealed segment
    p = run_py("""
        import sys, pylog
        with pylog.Log(sys.argv[1]) as w:
            w.truncate(int(sys.argv[2]))
    """, path, str(cut))
    assert p.returncode == 0, p.stderr
    assert r.verify() == []
    assert r.next_offset == cut
    r.close()


def test_a_closed_store_opens_no_reader(tmp_path):
    """A topic handle of a closed store (writable or read-only) raises LogClosedError from
    reader() as from every other method; it used to open a new read-only Log (never closed)."""
    root = str(tmp_path / "root")
    s = pylog.LogStore(root)
    s.create_topic("t")
    t = s.topic("t")
    t.append(b"x")
    ro = pylog.LogStore(root, readonly=True)
    rt = ro.topic("t")
    s.close()
    ro.close()
    for topic in (t, rt):
        try:
            topic.reader(0)
        except pylog.LogClosedError as e:
            assert "'t' is closed" in str(e)
        else:
            raise AssertionError("reader() of a closed store's topic returned a Log")
