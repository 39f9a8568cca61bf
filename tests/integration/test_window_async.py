# SPDX-License-Identifier: MIT
"""Shuffled windows are never built on the main loop (issue #22), with a real feedd.

A walk that reaches a window nobody built yet waits for it (built on the pool,
or by the feed's builder thread) without holding up the main loop: while the
first window of a client's feed takes seconds to build (the test hook
FEEDD_SLOW_WINDOW_BUILD_MS of daemon/feed/feed-windows.c makes every build
that much slower), `feedctl status` answers at once and another feed's client
keeps getting batches; then the client's batches are the contract's
(tests/ref/feed_ref.py), bit for bit. Megatron feeds, one stream per rank and
feedd's default virtual ranks (an elastic session's streams, section 17);
a text feed against the same daemon's batches without the hook.

Runs with Debian's /usr/bin/python3.
"""

import shutil
import threading
import time

import numpy as np
import pytest

from conftest import TIME_SCALE, assert_batches_equal, feed_conf, gen_megatron, reference, reference_virtual
from test_scale import text_scale_conf, write_zst_shards

# A window build's extra time; status must answer far faster meanwhile (scaled for slow wrappers).
SLOW_MS = int(3000 * TIME_SCALE)
# What a `feedctl status` may take while a window builds: a process start and one round trip, on a loaded VM.
STATUS_MAX_S = 0.5 * TIME_SCALE


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two Megatron datasets: the slow one's 4 shards (2 windows of 2) and the other feed's."""
    slow, other = tmp_path_factory.mktemp("slow"), tmp_path_factory.mktemp("other")
    gen_megatron.main([str(slow), "--shards", "4", "--docs-per-shard", "300", "--mean-len", "500", "--seed", "11"])
    gen_megatron.main([str(other), "--shards", "2", "--docs-per-shard", "300", "--mean-len", "500", "--seed", "12"])
    return slow, other


def dump_while_polling(d, feed, out, batches, world=1, cursor=None):
    """A dump of `feed` while another thread asks `feedctl status --json` every 50 ms: (batches, seconds the
    dump took, [(latency, the other feed's batches), ...])."""
    samples = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            t0 = time.monotonic()
            st = d.status()
            other = {f["name"]: f for f in st["feeds"]}["other"]["batches"]
            samples.append((time.monotonic() - t0, other))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.monotonic()
    try:
        got = d.dump(feed, out, world=world, batches=batches, cursor=cursor)
    finally:
        took = time.monotonic() - t0
        stop.set()
        poller.join()
    return got, took, samples


def slow_dump_beside_other(d, feed, out, batches, cursor=None):
    """feed's first `batches` batches dumped while feed "other"'s client reads (one batch every 20 ms) and status
    is asked every 50 ms; asserts the dump waited for the slow window while status answered at once and the
    other client kept getting batches. cursor: resume there. Returns the batches."""
    client = d.client("other", 0, 1, 1000000, sleep_ms=20)
    try:
        # The other client is under way before the slow feed's first window is asked for.
        deadline = time.monotonic() + 10 * TIME_SCALE
        while {f["name"]: f for f in d.status()["feeds"]}["other"]["batches"] < 5:
            assert time.monotonic() < deadline, "the other feed's client got no batches"
            time.sleep(0.05)
        got, took, samples = dump_while_polling(d, feed, out, batches, cursor=cursor)
        assert client.poll() is None, client.communicate()
    finally:
        client.kill()
        client.communicate()
    # The first window was waited for ...
    assert took >= SLOW_MS / 1000 * 0.9, took
    # ... while status answered, every time, ...
    latencies = [lat for lat, _ in samples]
    assert max(latencies) < STATUS_MAX_S, f"status waited {max(latencies):.2f} s: the main loop was held up"
    assert len(latencies) >= 5, latencies
    # ... and the other feed's client kept getting batches (one every 20 ms: dozens while the window builds).
    assert samples[-1][1] - samples[0][1] >= 20, samples
    return got


@pytest.mark.parametrize("vranks", [0, None], ids=["per-rank", "default-virtual"])
def test_a_slow_first_window_holds_up_neither_status_nor_another_feed(daemon, shards, tmp_path, monkeypatch, vranks):
    slow, other = shards
    monkeypatch.setenv("FEEDD_SLOW_WINDOW_BUILD_MS", str(SLOW_MS))
    # The other feed is not shuffled: it builds no window, so the hook does not slow it.
    d = daemon(feed_conf("slow", f"{slow}/shard_*.idx", window=2, vranks=vranks) +
               feed_conf("other", f"{other}/shard_*.idx", shuffle="false"))
    n = 12
    got = slow_dump_beside_other(d, "slow", tmp_path / "slow", n)
    wa = {f["name"]: f for f in d.status()["feeds"]}["slow"]["work_ahead"]
    assert wa["windows_not_ready"] >= 1, wa

    # Bit for bit the contract's batches.
    ref = reference if vranks == 0 else reference_virtual
    exp = ref(f"{slow}/shard_*.idx", 0, 1, n, window=2)
    assert_batches_equal(got, exp)



@pytest.mark.parametrize("packing", ["concat", "bestfit"])
def test_a_resume_waits_for_its_window_off_the_main_loop(daemon, shards, tmp_path, monkeypatch, packing):
    """A cursor's window not built yet: the resume's streams open once the pool built it (session-open.c), the
    main loop free meanwhile; the batches are the contract's from the cursor on (bestfit replays its buffer)."""
    slow, other = shards
    text = (feed_conf("slow", f"{slow}/shard_*.idx", window=2, extra=f"packing = {packing}\n") +
            feed_conf("other", f"{other}/shard_*.idx", shuffle="false"))
    d = daemon(text)
    want = d.dump("slow", tmp_path / "want", batches=40)
    assert d.stop() == 0
    at = 30  # a fresh daemon has built no window: the cursor's is built (slowly) for the resume
    monkeypatch.setenv("FEEDD_SLOW_WINDOW_BUILD_MS", str(SLOW_MS))
    d2 = daemon(text)
    got = slow_dump_beside_other(d2, "slow", tmp_path / "late", 5, cursor=want["cursors"][at])
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], want[k][at + 1:at + 6]), k

@pytest.mark.skipif(not shutil.which("zstd"), reason="zstd missing")
@pytest.mark.parametrize("vranks", [0, None], ids=["per-rank", "default-virtual"])
def test_a_slow_text_window_holds_up_neither_status_nor_another_feed(daemon, shards, tmp_path, monkeypatch, vranks):
    """Text (.jsonl.zst, shuffled): the window's shards are counted by the builder or the pool, its list built
    there too; the batches are those of a daemon without the hook."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 12, 20)
    v = "" if vranks is None else f"virtual_ranks = {vranks}\n"
    text = text_scale_conf(folder, tmp_path / "cache", window=3) + v + "count_ahead = false\n"
    _, other = shards
    n = 8
    monkeypatch.setenv("FEEDD_SLOW_WINDOW_BUILD_MS", str(SLOW_MS))
    d = daemon(text + feed_conf("other", f"{other}/shard_*.idx", shuffle="false"))
    got = slow_dump_beside_other(d, "t", tmp_path / "slow", n)
    assert d.stop() == 0

    monkeypatch.delenv("FEEDD_SLOW_WINDOW_BUILD_MS")
    d2 = daemon(text)
    exp = d2.dump("t", tmp_path / "plain", batches=n)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], exp[k]), k
