# SPDX-License-Identifier: MIT
"""A resume opens its streams without counting on the main loop (issue #22), with a real feedd.

A cursor (fc1, fc2) or an elastic state (fv1) names positions in windows
whose shards a cold cache_dir has not counted (counts file absent, the
background count pass off). Counting such a window is the pool's work: the
attach is answered at once, the session waits OPENING while a slow shard of
the window (the test hook FEEDD_TEXT_SLOW_INDEX of daemon/format/text_build.c)
is counted, and meanwhile `feedctl status` answers and another feed's client
keeps getting batches. The resumed stream is the uninterrupted one's, bit for
bit; a tampered <kw> on a cold cache still fails with its message (now at the
first batch, not the attach); `feedctl explain` from a cold cursor answers,
the main loop free, and its pieces are the delivered rows' tokens.

Runs with Debian's /usr/bin/python3.
"""

import json
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import FEEDCTL, TIME_SCALE
from feed_ref import cursor_check as check_of
from test_lazy_text import mix_conf as lazy_mix_conf
from test_scale import text_scale_conf, write_zst_shards

pytestmark = pytest.mark.skipif(not shutil.which("zstd"), reason="zstd missing")

# The slow shard's extra time; status must answer well within it meanwhile (scaled for slow wrappers).
SLOW_MS = int(3000 * TIME_SCALE)
# What "the main loop is free" means here: a status answered in under this, while the resume counts for SLOW_MS.
STATUS_MAX_S = 0.5 * TIME_SCALE
WINDOW = 4  # shards per window: unshuffled, window w is shards 4w .. 4w + 3


def conf(folder, cache, name="t", vranks=0):
    """Unshuffled (window w holds shards 4w..4w+3, so the test knows which shard to slow), no count pass."""
    text = text_scale_conf(folder, cache, window=WINDOW).replace("shuffle = true", "shuffle = false")
    return text.replace("[feed.t]", f"[feed.{name}]") + f"virtual_ranks = {vranks}\ncount_ahead = false\n"


def with_other(text, other, cache):
    """The config plus feed `o` (another folder), whose client must keep reading while t's resume counts."""
    o = conf(other, cache, name="o")
    return text + o[o.index("[feed.o]"):]


def mix_conf(a, b, cache):
    """An unshuffled mixture of two text sources (fc2 cursors), no count pass."""
    return lazy_mix_conf(a, b, cache, ahead=False, shuffle=False, window=WINDOW)


def feeds(d):
    return {f["name"]: f for f in d.status()["feeds"]}


def with_check(fields):
    body = "-".join(fields)
    return f"{body}-{check_of(body):08x}"


def state_parts(state):
    """(head fields, entries, <kw> list) of an fv1 state of a feed of one stream (section 17.5)."""
    f = state.split("-")
    n = int(f[6], 16)
    return f[:7], [f[7 + 7 * i:14 + 7 * i] for i in range(n)], f[7 + 7 * n:-1]


def polling(d, run, other=None):
    """run() while another thread asks `feedctl status` every 50 ms: (run's result, seconds it took, each status'
    latency, feed `other`'s batches at each answer). The states its clients were seen in go to STATES."""
    latencies, other_batches = [], []
    STATES.clear()
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.monotonic()
            st = json.loads(d.ctl("status", "--json").stdout)
            latencies.append(time.monotonic() - t0)
            STATES.update(c["state"] for c in st["clients"])
            if other:
                other_batches.append({f["name"]: f for f in st["feeds"]}[other]["batches"])
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.monotonic()
    try:
        got = run()
    finally:
        took = time.monotonic() - t0
        stop.set()
        poller.join()
    return got, took, latencies, other_batches


STATES = set()


def same_batches(got, want, lo, hi):
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], want[k][lo:hi]), k


def assert_main_loop_free(took, latencies, other_batches=None, opening=True):
    # The slow shard was on the resume's path: it waited for it ...
    assert took >= SLOW_MS / 1000 * 0.9, took
    # ... and status was answered meanwhile (on a feedd that counts on the main loop it waits the whole SLOW_MS) ...
    assert len(latencies) >= 5, latencies
    print(f"resume took {took:.2f} s; status latency max {max(latencies) * 1000:.0f} ms over {len(latencies)} asks")
    assert max(latencies) < STATUS_MAX_S, f"status waited {max(latencies):.2f} s: the main loop was held up"
    # ... as were the other feed's batches.
    if other_batches is not None:
        assert other_batches[-1] > other_batches[0], other_batches
    # The resuming client was seen waiting for its counts (status says why its batches wait).
    assert not opening or "opening" in STATES, STATES


def start_other(d):
    """feed o's client, reading a batch every 20 ms, attached and read from before the resume starts."""
    other = d.client("o", 0, 1, 100000, sleep_ms=20)
    deadline = time.monotonic() + 10 * TIME_SCALE
    while feeds(d)["o"]["batches"] < 2:
        assert other.poll() is None and time.monotonic() < deadline, other.communicate()
        time.sleep(0.02)
    return other


def stop_other(other):
    assert other.poll() is None, other.communicate()
    other.kill()
    other.communicate()


@pytest.fixture
def corpus(tmp_path):
    folder, other = tmp_path / "zst", tmp_path / "other"
    write_zst_shards(folder, 400, 3)
    write_zst_shards(other, 40, 3)
    return folder, other


def cold_at_cursor(daemon, tmp_path, monkeypatch, corpus, batches, at=60):
    """feed t's batches from the start (a warm daemon), then a daemon on a cold cache_dir whose first shard of
    cursor `at`'s window is slow, with feed o's client started: (batches, cursor, its window, daemon, client)."""
    folder, other = corpus
    d = daemon(conf(folder, tmp_path / "warm"))
    want = d.dump("t", tmp_path / "want", batches=batches)
    assert d.stop() == 0
    cursor = want["cursors"][at]
    window = int(cursor.split("-")[6], 16)
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t{WINDOW * window:05d}.jsonl.zst:{SLOW_MS}")
    d2 = daemon(with_other(conf(folder, tmp_path / "cold"), other, tmp_path / "cold"))
    return want, cursor, window, d2, start_other(d2)


def test_a_cold_fc1_resume_counts_its_window_on_the_pool(daemon, tmp_path, monkeypatch, corpus):
    folder, _ = corpus
    at = 60
    want, cursor, window, d2, oc = cold_at_cursor(daemon, tmp_path, monkeypatch, corpus, 70, at)
    assert window >= 40, cursor
    late, took, lat, ob = polling(d2, lambda: d2.dump("t", tmp_path / "late", batches=5, cursor=cursor), "o")
    stop_other(oc)
    assert_main_loop_free(took, lat, ob)
    same_batches(late, want, at + 1, at + 6)
    assert d2.stop() == 0

    # A cursor without <kw> (made before issue #22) counts every window before its own, on the pool too.
    body = "-".join(cursor.split("-")[:10])
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t{WINDOW * (window - 10):05d}.jsonl.zst:{SLOW_MS}")
    d3 = daemon(conf(folder, tmp_path / "cold2"))
    again, took, lat, _ = polling(d3, lambda: d3.dump("t", tmp_path / "again", batches=5,
                                                     cursor=f"{body}-{check_of(body):08x}"))
    assert_main_loop_free(took, lat)
    same_batches(again, want, at + 1, at + 6)
    assert d3.stop() == 0


def test_a_cold_fc2_resume_counts_its_windows_on_the_pool(daemon, tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    write_zst_shards(a, 400, 3)
    write_zst_shards(b, 400, 3)
    d = daemon(mix_conf(a, b, tmp_path / "warm"))
    want = d.dump("m", tmp_path / "want", batches=130)
    assert d.stop() == 0
    at = 120
    cursor = want["cursors"][at]
    f = cursor.split("-")
    assert f[0] == "fc2" and int(f[8], 16) == 2, cursor
    wa = int(f[10], 16)
    assert wa >= 40, cursor
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"a/t{WINDOW * wa:05d}.jsonl.zst:{SLOW_MS}")
    d2 = daemon(mix_conf(a, b, tmp_path / "cold"))
    late, took, lat, _ = polling(d2, lambda: d2.dump("m", tmp_path / "late", batches=5, cursor=cursor))
    assert_main_loop_free(took, lat)
    same_batches(late, want, at + 1, at + 6)
    assert d2.stop() == 0


def test_a_cold_fv1_resume_counts_its_windows_on_the_pool_and_a_tampered_kw_still_fails(daemon, tmp_path,
                                                                                       monkeypatch, corpus):
    folder, other = corpus
    d = daemon(conf(folder, tmp_path / "warm", vranks=4))
    want = d.dump("t", tmp_path / "want", batches=70)
    assert d.stop() == 0
    at = 60
    state = want["cursors"][at]
    head, entries, kw = state_parts(state)
    assert head[0] == "fv1" and len(entries) == 4 and len(kw) == 4, state
    windows = sorted({int(e[4], 16) for e in entries})
    assert windows[0] >= 40, state
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t{WINDOW * windows[0]:05d}.jsonl.zst:{SLOW_MS}")
    d2 = daemon(with_other(conf(folder, tmp_path / "cold", vranks=4), other, tmp_path / "cold"))
    oc = start_other(d2)
    late, took, lat, ob = polling(d2, lambda: d2.dump("t", tmp_path / "late", batches=5, cursor=state), "o")
    assert_main_loop_free(took, lat, ob)
    same_batches(late, want, at + 1, at + 6)

    # A <kw> off by one on a cold cache_dir (another daemon: nothing counted): its <index> names none of the
    # stream's documents once the window is counted, on the pool: the client is told at its first batch, with the
    # message the attach gave when it counted on the main loop.
    d3 = daemon(with_other(conf(folder, tmp_path / "cold2", vranks=4), other, tmp_path / "cold2"))
    oc3 = start_other(d3)
    kw_bad = [format(int(kw[0], 16) + 1, "x")] + kw[1:]
    bad, took, lat, ob = polling(d3, lambda: d3.dump("t", tmp_path / "bad", batches=1, check=False,
                                                     cursor=with_check(head + sum(entries, []) + kw_bad)), "o")
    assert not isinstance(bad, dict) and bad.returncode != 0, bad
    assert "does not name a position of virtual stream" in bad.stderr, bad.stderr
    assert_main_loop_free(took, lat, ob)
    # The feed serves on, for this rank too.
    same_batches(d3.dump("t", tmp_path / "after", batches=5, cursor=state), want, at + 1, at + 6)
    for c in (oc, oc3):
        stop_other(c)
    assert d2.stop() == 0 and d3.stop() == 0


def read_doc(path, i):
    """Document i (0-based line) of a .jsonl.zst shard."""
    text = subprocess.run(["zstd", "-q", "-d", "-c", str(path)], check=True, capture_output=True).stdout
    return json.loads(text.splitlines()[i])["text"]


def test_explain_from_a_cold_cursor_waits_for_the_pool_and_equals_the_delivered_rows(daemon, tmp_path,
                                                                                  monkeypatch, corpus):
    folder, _ = corpus
    at = 60
    want, cursor, _, d2, oc = cold_at_cursor(daemon, tmp_path, monkeypatch, corpus, 64, at)
    text, took, lat, ob = polling(d2, lambda: d2.ctl("explain", "t", "--rank", "0", "--world", "1", "--cursor",
                                                     cursor, "--batches", "3").stdout, "o")
    stop_other(oc)
    assert_main_loop_free(took, lat, ob, opening=False)  # an explanation is no client
    rows = [line.split() for line in text.splitlines()]
    assert rows, "explain printed nothing"
    first = min(int(w[1]) for w in rows)
    covered = 0
    docs = {}
    for w in rows:
        kv = {k: w[w.index(k) + 1] for k in ("shard", "doc", "tokens", "of", "file")}
        b, row = int(w[1]) - first, int(w[3])
        c0, c1 = map(int, w[5].split("-"))
        t0, t1 = map(int, kv["tokens"].split("-"))
        path = kv["file"] if kv["file"].startswith("/") else folder / kv["file"]
        key = (str(path), int(kv["doc"]))
        if key not in docs:
            docs[key] = list(read_doc(path, int(kv["doc"])).encode())  # bytes.tiktoken: a token per byte
        toks = docs[key]
        assert int(kv["of"]) == len(toks), (kv, len(toks))
        exp = toks[t0:t1] + ([10] if "+eos" in w else [])
        assert want["input_ids"][at + 1 + b][row][c0:c1 + 1].tolist() == exp, (w, b, row)
        covered += c1 - c0 + 1
    assert covered == 3 * 4 * 128, covered  # concat: every delivered position explained
    assert d2.stop() == 0


def test_a_client_that_leaves_while_its_explanation_waits_cancels_it(daemon, tmp_path, monkeypatch, corpus):
    folder, _ = corpus
    d = daemon(conf(folder, tmp_path / "warm"))
    cursor = d.dump("t", tmp_path / "want", batches=62)["cursors"][60]
    assert d.stop() == 0
    window = int(cursor.split("-")[6], 16)
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t{WINDOW * window:05d}.jsonl.zst:{SLOW_MS}")
    d2 = daemon(conf(folder, tmp_path / "cold"))
    p = subprocess.Popen([str(FEEDCTL), "--socket", d2.socket, "explain", "t", "--rank", "0", "--world", "1",
                          "--cursor", cursor, "--batches", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.3 * TIME_SCALE)
    # Waiting for the pool, not answered; the main loop answers status meanwhile.
    t0 = time.monotonic()
    d2.status()
    assert time.monotonic() - t0 < STATUS_MAX_S, f"status waited {time.monotonic() - t0:.2f} s"
    assert p.poll() is None, p.communicate()
    p.kill()
    p.communicate()
    # The daemon goes on serving (that rank's resume included) and stops cleanly.
    t0 = time.monotonic()
    assert d2.dump("t", tmp_path / "after", batches=1, cursor=cursor)["input_ids"].shape[0] == 1
    assert time.monotonic() - t0 < SLOW_MS / 1000 * 2
    assert d2.stop() == 0


def test_a_cold_fv1_resume_of_1024_streams_opens_in_a_few_round_trips(daemon, tmp_path):
    """1,024 virtual streams spread over ~40 windows: one attempt names every shard their positions miss (up to
    256 a round), so the open takes a few rounds to the pool, not one per stream or per shard."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 400, 30)
    d = daemon(conf(folder, tmp_path / "warm", vranks=1024))
    n = 300
    want = d.dump("t", tmp_path / "want", batches=n)
    assert d.stop() == 0
    state = want["cursors"][n - 6]
    _, entries, kw = state_parts(state)
    windows = {int(e[4], 16) for e in entries}
    print(f"{len(entries)} streams in {len(windows)} windows")
    assert len(entries) == 1024 and len(windows) >= 8, (len(entries), sorted(windows))
    d2 = daemon(conf(folder, tmp_path / "cold", vranks=1024))
    late = d2.dump("t", tmp_path / "late", batches=5, cursor=state)
    same_batches(late, want, n - 5, n)
    log = d2.log_text()
    attempts = [int(line.split(" attempts")[0].split()[-1]) for line in log.splitlines() if "streams open after" in line]
    print(f"opened after {attempts} attempts")
    assert attempts and attempts[0] <= 4, log
    assert d2.stop() == 0
