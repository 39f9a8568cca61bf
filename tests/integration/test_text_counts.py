# SPDX-License-Identifier: MIT
"""Text shards counted off the main loop (issue #22), with a real feedd.

A walk that reaches a window whose shards were never counted waits for the
count (done on the pool) without holding up the main loop: another client's
batches and `feedctl status` go on while a slow shard (the test hook
FEEDD_TEXT_SLOW_INDEX of daemon/format/text_build.c) is counted, and the
batches are the same as without it. The attach's "at least R documents" of a
text feed is decided after the attach when the shards counted by then do
not decide it. The background count pass (count_ahead) counts every shard
soon after load, without a client, skipping one it cannot read (left to its
window's walk), and writes the counts file; the batches do not change.

Runs with Debian's /usr/bin/python3.
"""

import shutil
import threading
import time

import numpy as np
import pytest

from conftest import TIME_SCALE
from test_scale import text_scale_conf, write_zst_shards

pytestmark = pytest.mark.skipif(not shutil.which("zstd"), reason="zstd missing")

# The slow shard's extra time; status must answer in under half of it meanwhile (scaled for slow wrappers).
SLOW_MS = int(4000 * TIME_SCALE)


def conf(folder, cache, name="t", shuffle="false", window=1, ahead="false"):
    """ahead: count_ahead, the background count pass (off: what the walks count, alone)."""
    text = text_scale_conf(folder, cache, window=window).replace("shuffle = true", f"shuffle = {shuffle}")
    return text.replace("[feed.t]", f"[feed.{name}]") + f"virtual_ranks = 0\ncount_ahead = {ahead}\n"


def feed_section(text):
    """The [feed.X] part of a config (a second feed of the same daemon)."""
    return text[text.index("[feed."):]


def dump_polling_status(d, out, batches):
    """A dump of feed t while another thread asks `feedctl status` every 50 ms: (batches, seconds the dump took,
    each status' latency)."""
    latencies = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.monotonic()
            d.ctl("status", "--json")
            latencies.append(time.monotonic() - t0)
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.monotonic()
    try:
        got = d.dump("t", out, batches=batches)
    finally:
        took = time.monotonic() - t0
        stop.set()
        poller.join()
    return got, took, latencies


# Unshuffled. t00020 with one shard per window: window 20, reached after a few batches. t00001 with two: the
# attach's first window, whose other shard load counted (it needed one document).
@pytest.mark.parametrize("slow,window", [(20, 1), (1, 2)], ids=["mid-stream", "first-window"])
def test_a_slow_window_holds_up_neither_the_main_loop_nor_another_feed(daemon, tmp_path, monkeypatch, slow, window):
    slow_dir, other_dir = tmp_path / "slow", tmp_path / "other"
    write_zst_shards(slow_dir, 40, 3)
    write_zst_shards(other_dir, 40, 3)
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t{slow:05d}.jsonl.zst:{SLOW_MS}")
    d = daemon(conf(slow_dir, tmp_path / "cache", window=window) +
               feed_section(conf(other_dir, tmp_path / "cache", name="o")))
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["t"]["state"] == "ready" and st["o"]["state"] == "ready", st
    assert st["t"]["work_ahead"]["text_shards_indexed"] <= slow, st["t"]["work_ahead"]

    # The other feed's client reads on throughout (a batch every 20 ms).
    other = d.client("o", 0, 1, 100000, sleep_ms=20)
    got, took, latencies = dump_polling_status(d, tmp_path / "slow_dump", 20)
    other_batches = {f["name"]: f for f in d.status()["feeds"]}["o"]["batches"]
    assert other.poll() is None, other.communicate()
    other.kill()
    other.communicate()
    assert got["input_ids"].shape[0] == 20
    # The slow shard was reached: the dump waited for it ...
    assert took >= SLOW_MS / 1000 * 0.9, took
    # ... and status was answered meanwhile, as were the other feed's batches.
    assert len(latencies) >= 10, latencies
    assert max(latencies) < SLOW_MS / 1000 / 2, f"status waited {max(latencies):.2f} s: the main loop was held up"
    assert other_batches > 0

    # The same batches as a daemon without the slow shard.
    monkeypatch.delenv("FEEDD_TEXT_SLOW_INDEX")
    d2 = daemon(conf(slow_dir, tmp_path / "cache2", window=window))
    exp = d2.dump("t", tmp_path / "plain_dump", batches=20)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], exp[k]), k


def test_a_slow_index_of_a_counted_window_does_not_hold_up_the_main_loop(daemon, tmp_path, monkeypatch):
    """Shuffled, on a warm cache_dir: every count is known at READY (the counts file) but no shard is indexed
    (small shards keep no index file), so walks enter every window at once and only the index is awaited: the
    walk that sizes documents from it has it made on the pool (feed_shard_readable), and the window builder,
    indexing a window ahead, is not waited for by a walk that reaches the window meanwhile (it builds the
    window itself: feed-windows.c, COUNTING; whether the builder is still there then is up to the scheduler).
    The batches are those of the run that counted."""
    folder, cache = tmp_path / "zst", tmp_path / "cache"
    write_zst_shards(folder, 40, 3)
    d = daemon(conf(folder, cache, shuffle="true", ahead="true"))
    wait_counted(d)
    exp = d.dump("t", tmp_path / "plain", batches=20)
    assert d.stop() == 0
    monkeypatch.setenv("FEEDD_TEXT_SLOW_INDEX", f"t00020.jsonl.zst:{SLOW_MS}")
    d = daemon(conf(folder, cache, shuffle="true", ahead="true"))
    st = d.status()["feeds"][0]
    assert st["work_ahead"]["text_counts_from_cache"] == 40, st["work_ahead"]
    got, took, latencies = dump_polling_status(d, tmp_path / "slow", 20)
    assert took >= SLOW_MS / 1000 * 0.9, took
    assert max(latencies) < SLOW_MS / 1000 / 2, f"status waited {max(latencies):.2f} s: the main loop was held up"
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], exp[k]), k


def test_the_attach_check_of_r_documents_is_decided_after_the_attach(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 10, 3)
    d = daemon(conf(folder, tmp_path / "cache", shuffle="true", window=2))
    wa = d.status()["feeds"][0]["work_ahead"]
    # Load counted until one document: not the 8 a world of 8 needs.
    assert wa["text_shards_indexed"] < 3, wa
    got = d.dump("t", tmp_path / "w8", rank=7, world=8, batches=2)
    assert got["input_ids"].shape[0] == 2
    # 30 documents in all: a world of 31 is refused once they are counted, with the attach's message.
    p = d.dump("t", tmp_path / "w31", rank=0, world=31, batches=1, check=False)
    assert not isinstance(p, dict) and p.returncode != 0
    assert "has 30 non-empty documents, fewer than the world size 31" in p.stderr, p.stderr
    # And the feed serves on.
    assert d.dump("t", tmp_path / "again", rank=0, world=30, batches=1)["input_ids"].shape[0] == 1


def wait_counted(d, name="t", timeout=60 * TIME_SCALE):
    deadline = time.monotonic() + timeout
    while True:
        st = {f["name"]: f for f in d.status()["feeds"]}[name]
        if not st["work_ahead"]["text_count_pass_running"]:
            return st
        assert time.monotonic() < deadline, st["work_ahead"]
        time.sleep(0.05)


def test_the_background_pass_counts_every_shard_without_a_client(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 200, 3)
    bad = folder / "t00150.jsonl.zst"
    bad.write_bytes(b"this is not zstd" * 8)
    # Unshuffled: the bad shard is window 37 of 50, past the batches dumped here.
    d = daemon(conf(folder, tmp_path / "cache", window=4, ahead="true"))
    st = wait_counted(d)
    wa = st["work_ahead"]
    # Every shard but the bad one, most by the pass; the feed still serves (the bad shard fails its window only).
    assert st["state"] == "ready", st
    assert wa["text_shards_indexed"] == 199 and wa["text_shards_pending"] == 1, wa
    assert wa["text_shards_counted_ahead"] >= 190, wa
    assert st["documents"] == 199 * 3, st
    # No index is kept by the pass: counts only.
    assert wa["text_indexes_in_memory"] <= 4, wa
    got = d.dump("t", tmp_path / "with", batches=6)
    assert d.stop() == 0

    # The same batches without the pass.
    plain = daemon(conf(folder, tmp_path / "cache2", window=4))
    exp = plain.dump("t", tmp_path / "without", batches=6)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], exp[k]), k
    assert plain.stop() == 0


def test_the_background_pass_writes_the_counts_file(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 120, 3)
    cache = tmp_path / "cache"
    d = daemon(conf(folder, cache, shuffle="true", window=4, ahead="true"))
    st = wait_counted(d)
    assert st["work_ahead"]["text_shards_pending"] == 0 and st["documents"] == 360, st
    # Written by the once-a-second poll once every shard is counted, before any client came.
    deadline = time.monotonic() + 10
    while not list(cache.glob("counts-*")):
        assert time.monotonic() < deadline, sorted(p.name for p in cache.iterdir())
        time.sleep(0.1)
    assert d.stop() == 0
    # A later start reads every count from it: totals known at READY, nothing left to count.
    d2 = daemon(conf(folder, cache, shuffle="true", window=4, ahead="true"))
    st = {f["name"]: f for f in d2.status()["feeds"]}["t"]
    assert st["documents"] == 360 and st["work_ahead"]["text_counts_from_cache"] == 120, st
    assert not st["work_ahead"]["text_count_pass_running"], st
