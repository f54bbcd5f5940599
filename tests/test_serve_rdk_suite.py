"""librdkafka's own test suite against ``pylog serve`` (scripts/librdkafka-suite.py, docs/serve.md
"librdkafka's test suite").

Building its test runner takes ~25 minutes on 2 cores and a run ~10: the run is checked against
the table in docs/serve.md only with ``PYLOG_LONG=1`` (which also builds it) or when a build is
cached (``python3 scripts/librdkafka-suite.py build``). The script's parsing is checked always.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import LONG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "librdkafka-suite.py")


def _suite():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("librdkafka_suite", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


suite = _suite()


def test_declared_tests_and_why_they_do_not_apply(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.c").write_text("""
struct test tests[] = {
    _TEST(0004_conf, TEST_F_LOCAL),
    _TEST(0011_produce_batch,
          0,
          /* Produces a lot of messages */
          _THRES(.ucpu = 40.0, .scpu = 8.0)),
#if WITH_SOCKEM
    _TEST(0049_consume_conn_close, TEST_F_SOCKEM, TEST_BRKVER(0, 9, 0, 0)),
#endif
    _TEST(0052_msg_timestamps, 0, TEST_BRKVER(0, 10, 0, 0)),
    _TEST(0107_topic_recreate, 0, TEST_BRKVER_TOPIC_ADMINAPI, .scenario = "noautocreate"),
    _TEST(0045_subscribe_update_topic_remove, 0, .scenario = "noautocreate"),
    _TEST(0103_transactions, 0, TEST_BRKVER(0, 11, 0, 0), .scenario = "default,ak23"),
    _TEST(0104_fetch_from_follower_mock, TEST_F_LOCAL, .scenario = "ak23"),
    _TEST(0199_made_up, 0, .scenario = "ak23"),
    _TEST(0170_share_consumer_subscription, 0, TEST_BRKVER(4, 2, 0, 0)),
    _TEST(8000_idle, TEST_F_MANUAL),
    {NULL}};
""")
    got = dict(suite.declared_tests(tmp_path))
    assert list(got) == ["0004_conf", "0011_produce_batch", "0049_consume_conn_close", "0052_msg_timestamps",
                         "0107_topic_recreate", "0045_subscribe_update_topic_remove", "0103_transactions",
                         "0104_fetch_from_follower_mock", "0199_made_up", "0170_share_consumer_subscription",
                         "8000_idle"]
    assert got["0011_produce_batch"] is None and got["0052_msg_timestamps"] is None
    assert got["0004_conf"].startswith("local") and "sockem" in got["0049_consume_conn_close"]
    assert "replication factor 3" in got["0107_topic_recreate"]
    assert "Kafka 4.2" in got["0170_share_consumer_subscription"]
    # the noautocreate scenario runs (against a second broker, with -s); "default,ak23" is the default one
    assert got["0045_subscribe_update_topic_remove"] is None
    assert suite.SCENARIOS["0045_subscribe_update_topic_remove"] == "noautocreate"
    assert "replication factor 3" in got["0103_transactions"] and "0103_transactions" not in suite.SCENARIOS
    assert got["0104_fetch_from_follower_mock"].startswith("local") and "scenario ak23" in got["0199_made_up"]
    assert got["8000_idle"].startswith("manual")


def test_results_from_the_summary_or_from_the_banners():
    summary = ("\x1b[0m|\x1b[32m 0011_produce_batch                       |     PASSED |   4.401s \x1b[0m|\n"
               "|\x1b[31m 0081_admin                               |     FAILED |  20.4s \x1b[0m|\x1b[31m "
               "do_test_CreateAcls():1604: Test assertion failed\x1b[0m\n"
               "| 0028_long_topicnames | SKIPPED | 0.000s | Filtered due to negative test flags\n")
    assert suite.summary_rows(summary) == {
        "0011_produce_batch": ("PASSED", ""),
        "0081_admin": ("FAILED", "do_test_CreateAcls():1604: Test assertion failed"),
        "0028_long_topicnames": ("SKIPPED", "Filtered due to negative test flags")}
    # the runner died at exit before its summary: the banners tell
    banners = ("[0052_msg_timestamps  /  0.000s] ================= Running test 0052_msg_timestamps ====\n"
               '### Test "0052_msg_timestamps" failed at test.c:5261:test_kafka_topics() at Sat Nov 28: ###\n'
               "[0052_msg_timestamps  /  0.000s] ================= Test 0052_msg_timestamps FAILED ====\n"
               "[0001_multiobj  /  1.6s] ================= Test 0001_multiobj PASSED ====\n")
    got = suite.summary_rows(banners)
    assert got["0001_multiobj"] == ("PASSED", "")
    assert got["0052_msg_timestamps"][0] == "FAILED" and got["0052_msg_timestamps"][1].startswith("test.c:5261")


def test_the_documented_table_is_whole():
    """docs/serve.md holds the table a whole run wrote: every declared test once (when the
    build is not here, the rows are checked on their own), and the tally line matches them."""
    doc = suite.documented()
    assert doc, "docs/serve.md has no librdkafka table: run python3 scripts/librdkafka-suite.py run"
    assert set(doc.values()) <= {"passed", "failing", "not applicable"}
    whole = [n for n in doc if "/" not in n]
    applicable = [n for n in whole if doc[n] != "not applicable"]
    passed = [n for n in applicable if doc[n] == "passed"]
    with open(os.path.join(ROOT, "docs", "serve.md")) as f:
        text = f.read()
    assert f"**{len(passed)} of {len(applicable)} applicable tests pass**" in text
    assert all(n in doc for n in suite.KNOWN_FAILURES), "KNOWN_FAILURES names a test the table lacks"
    assert all(doc[n] == "failing" for n in suite.KNOWN_FAILURES)
    if suite.built():
        assert whole == [n for n, _w in suite.declared_tests(suite.src_dir())]


@pytest.mark.slow
def test_librdkafka_suite_matches_the_documented_table():
    if not (LONG or suite.built()):
        pytest.skip("librdkafka's test suite: PYLOG_LONG=1 (builds it, ~25 min), or a cached build")
    p = subprocess.run([sys.executable, SCRIPT, "run", "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=3 * 3600)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
