# SPDX-License-Identifier: MIT
"""Megatron feeds end to end: a real feedd, real shards, real clients, every
batch against the sample-order contract.

Runs with Debian's /usr/bin/python3. Every expected batch comes from
tests/ref/feed_ref.py, an implementation of docs/sample-order.md written
independently of the daemon.
"""

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_batches_equal, feed_conf, gen_megatron, load_dump, open_fds, reference, reference_virtual


@pytest.mark.parametrize("vranks", [0, None], ids=["per-rank", "default-virtual"])
@pytest.mark.parametrize("world,rank,bos,eos,shuffle", [
    (1, 0, None, None, True),
    (2, 1, None, 50256, True),
    (3, 2, 50255, 50256, True),
    (2, 0, 1, None, False),
])
def test_batches_match_the_contract(daemon, dataset, tmp_path, world, rank, bos, eos, shuffle, vranks):
    """vranks None: feedd's default virtual_ranks (1024, section 17), against the reference's virtual streams."""
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", bos="none" if bos is None else bos,
                         eos="none" if eos is None else eos, shuffle="true" if shuffle else "false", vranks=vranks))
    n = 40
    got = d.dump("web", tmp_path / "out", rank=rank, world=world, batches=n)
    ref = reference if vranks == 0 else reference_virtual
    exp = ref(f"{dataset}/shard_*.idx", rank, world, n, bos=bos, eos=eos, shuffle=shuffle)
    assert_batches_equal(got, exp)


@pytest.mark.parametrize("vranks", [0, None], ids=["per-rank", "default-virtual"])
def test_stream_crosses_epochs_exactly(daemon, tmp_path, vranks):
    """A tiny feed makes many epochs pass; the reference says what each must hold (with the default
    virtual_ranks: V' = the 21 documents, section 17.4)."""
    data = tmp_path / "tiny"
    data.mkdir()
    rng = np.random.default_rng(5)
    for s in range(3):
        docs = [[rng.integers(0, 1000, int(n))] for n in rng.integers(0, 40, 7)]
        gen_megatron.write_shard(str(data / f"t{s}"), docs, "i32")
    d = daemon(feed_conf("tiny", f"{data}/t*.idx", seq_len=16, batch_size=3, window=2, eos=1000, vranks=vranks))
    got = d.dump("tiny", tmp_path / "out", rank=1, world=2, batches=60)
    ref = reference if vranks == 0 else reference_virtual
    exp = ref(f"{data}/t*.idx", 1, 2, 60, seq_len=16, batch_size=3, window=2, eos=1000)
    assert_batches_equal(got, exp)
    assert max(e["epoch"] for e in exp) >= 3


def test_four_ranks_receive_every_document_of_an_epoch_once(daemon, tmp_path):
    """Documents are made of one repeated id; eos separates them in each rank's stream."""
    data = tmp_path / "ids"
    data.mkdir()
    rng = np.random.default_rng(11)
    lengths = {}
    next_id = 2
    for s in range(5):
        docs = []
        for _ in range(int(rng.integers(20, 60))):
            n = int(rng.integers(1, 300))
            docs.append([np.full(n, next_id)])
            lengths[next_id] = n
            next_id += 1
        gen_megatron.write_shard(str(data / f"s{s}"), docs, "i32")
    world, L, B = 4, 128, 2
    d = daemon(feed_conf("ids", f"{data}/s*.idx", seq_len=L, batch_size=B, window=2, eos=1))
    total_docs = len(lengths)
    seen = []
    for rank in range(world):
        mine = (total_docs - rank + world - 1) // world  # k = rank, rank+R, ... < total
        need = sum(sorted(lengths.values())[-mine:]) + mine  # generous upper bound on the tokens
        batches = need // (B * L) + 2
        got = d.dump("ids", tmp_path / f"r{rank}", rank=rank, world=world, batches=batches)
        stream = got["input_ids"].reshape(-1)
        docs = []
        run = []
        for t in stream:
            if t == 1:
                docs.append(run)
                run = []
            else:
                run.append(int(t))
        ids = []
        for r in docs[:mine]:
            assert len(set(r)) == 1, "a document's tokens were interleaved with another's"
            assert len(r) == lengths[r[0]], f"document {r[0]}: {len(r)} tokens of {lengths[r[0]]} delivered"
            ids.append(r[0])
        seen += ids
    assert sorted(seen) == sorted(lengths), "epoch 0 must deliver each document exactly once across ranks"


def test_same_batches_whatever_the_thread_count(daemon, dataset, tmp_path):
    conf = feed_conf("web", f"{dataset}/shard_*.idx", seq_len=512, batch_size=8, eos=0)
    one = daemon(conf, threads=1)
    four = daemon(conf, threads=4)
    a = one.dump("web", tmp_path / "t1", rank=0, world=2, batches=50)
    b = four.dump("web", tmp_path / "t4", rank=0, world=2, batches=50)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(a[k], b[k]), k
    assert a["cursors"] == b["cursors"]


def test_resume_from_cursor_continues_exactly(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256))
    whole = d.dump("web", tmp_path / "whole", rank=1, world=3, batches=30)
    cut = 11
    rest = d.dump("web", tmp_path / "rest", rank=1, world=3, batches=30 - cut - 1, cursor=whole["cursors"][cut])
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(rest[k], whole[k][cut + 1:]), k
    assert rest["cursors"] == whole["cursors"][cut + 1:]
    for c in whole["cursors"]:
        assert re.fullmatch(r"fc1(-[0-9a-f]+){8}-[0-9a-f]{16}-[0-9a-f]{8}", c), c  # data identity, check


def test_killed_client_resumes_from_its_last_cursor(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256))
    # An undisturbed reader on another rank, to check the kill does not touch it.
    other = d.client("web", 0, 2, 40, sleep_ms=5)
    victim = d.client("web", 1, 2, 1000, sleep_ms=10)
    lines = []
    while len(lines) < 13:
        line = victim.stdout.readline()
        assert line, victim.stderr.read()
        if line.startswith("batch"):
            lines.append(line.split())
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    # Whatever the victim printed last is what it consumed; resume right after it.
    for line in victim.stdout.read().splitlines():
        if line.startswith("batch"):
            lines.append(line.split())
    last_index, last_cursor = int(lines[-1][1]), lines[-1][4]

    resumed = d.client("web", 1, 2, 10, cursor=last_cursor)
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    got = [l.split() for l in out.splitlines() if l.startswith("batch")]
    assert [int(g[1]) for g in got] == list(range(last_index + 1, last_index + 11))

    fresh = d.client("web", 1, 2, last_index + 11)
    out2, _ = fresh.communicate(timeout=60)
    want = [l.split() for l in out2.splitlines() if l.startswith("batch")][last_index + 1:]
    assert [g[3] for g in got] == [w[3] for w in want], "resumed batches differ from an uninterrupted run"

    o_out, o_err = other.communicate(timeout=60)
    assert other.returncode == 0, o_err
    ref = d.client("web", 0, 2, 40)
    r_out, _ = ref.communicate(timeout=60)
    assert [l.split()[3] for l in o_out.splitlines() if l.startswith("batch")] == \
           [l.split()[3] for l in r_out.splitlines() if l.startswith("batch")]


def test_cursor_mismatch_is_refused_with_a_reason(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx") + "\n" +
               feed_conf("other", f"{dataset}/shard_00[01].idx"))
    cur = d.dump("web", tmp_path / "a", rank=0, world=2, batches=3)["cursors"][-1]

    p = d.dump("web", tmp_path / "b", rank=0, world=4, batches=1, cursor=cur, check=False)
    assert p.returncode == 1 and "rank 0 of world 2" in p.stderr, p.stderr
    p = d.dump("other", tmp_path / "c", rank=0, world=2, batches=1, cursor=cur, check=False)
    assert p.returncode == 1 and "fingerprint" in p.stderr, p.stderr
    damaged = cur[:-1] + ("0" if cur[-1] != "0" else "1")
    p = d.dump("web", tmp_path / "d", rank=0, world=2, batches=1, cursor=damaged, check=False)
    assert p.returncode == 1 and "malformed or damaged" in p.stderr, p.stderr
    p = d.dump("nosuch", tmp_path / "e", batches=1, check=False)
    assert p.returncode == 1 and "no feed named 'nosuch'" in p.stderr, p.stderr


def test_broken_shard_fails_its_feed_only(daemon, dataset, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    gen_megatron.write_shard(str(bad / "b0"), [[np.arange(10)], [np.arange(5)]], "u16")
    raw = bytearray((bad / "b0.idx").read_bytes())
    raw[34 + 4:34 + 8] = (-3).to_bytes(4, "little", signed=True)  # lengths[1] = -3
    (bad / "b0.idx").write_bytes(bytes(raw))
    d = daemon(feed_conf("good", f"{dataset}/shard_*.idx") + "\n" + feed_conf("bad", f"{bad}/*.idx"))

    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["good"]["state"] == "ready"
    assert st["bad"]["state"] == "failed"
    assert "b0.idx" in st["bad"]["error"] and "lengths[1]" in st["bad"]["error"], st["bad"]["error"]
    assert "lengths[1]" in d.log_text()

    p = d.dump("bad", tmp_path / "x", batches=1, check=False)
    assert p.returncode == 1 and "lengths[1]" in p.stderr, p.stderr
    got = d.dump("good", tmp_path / "y", batches=5)
    assert_batches_equal(got, reference(f"{dataset}/shard_*.idx", 0, 1, 5))


def test_shard_changed_while_serving_stops_its_clients_with_the_file_named(daemon, tmp_path):
    data = tmp_path / "chg"
    gen_megatron.main([str(data), "--shards", "2", "--docs-per-shard", "300", "--seed", "9"])
    d = daemon(feed_conf("chg", f"{data}/shard_*.idx"))
    c = d.client("chg", 0, 1, 100000, sleep_ms=20)
    assert c.stdout.readline().strip() == "attached"
    with open(data / "shard_001.bin", "r+b") as f:
        f.truncate(100)
    out, _ = c.communicate(timeout=30)
    assert c.returncode == 1
    assert "shard_001" in out and "changed while serving" in out, out
    assert d.status()["feeds"][0]["state"] == "failed"


def test_world_larger_than_documents_is_refused(daemon, tmp_path):
    data = tmp_path / "few"
    data.mkdir()
    gen_megatron.write_shard(str(data / "f"), [[np.arange(5)], [np.array([], np.int64)], [np.arange(3)]], "u16")
    d = daemon(feed_conf("few", f"{data}/*.idx"))
    p = d.dump("few", tmp_path / "o", rank=0, world=3, batches=1, check=False)
    assert p.returncode == 1 and "2 non-empty documents, fewer than the world size 3" in p.stderr, p.stderr
    # With feedd's default virtual_ranks: V' = 3 documents (section 17.4). A world of 4 starts per rank (17.1,
    # the key is not set) and is refused for its documents, as without virtual ranks.
    d2 = daemon(feed_conf("few", f"{data}/*.idx", vranks=None))
    p = d2.dump("few", tmp_path / "o2", rank=0, world=4, batches=1, check=False)
    assert p.returncode == 1 and "fewer than the world size 4" in p.stderr, p.stderr
    assert d2.dump("few", tmp_path / "o3", rank=2, world=3, batches=2)["input_ids"].shape[0] == 2
    # A virtual_ranks the config sets is a promise: a larger world is refused, saying which key to raise.
    d3 = daemon(feed_conf("few", f"{data}/*.idx", vranks=3))
    p = d3.dump("few", tmp_path / "o4", rank=0, world=4, batches=1, check=False)
    assert p.returncode == 1 and "has 3 virtual ranks" in p.stderr and "fewer than the world size 4" in p.stderr, \
        p.stderr


def test_a_world_above_the_default_virtual_ranks_starts_per_rank(daemon, tmp_path):
    """Section 17.1: left at its default (1024), virtual_ranks does not refuse a larger job; it starts on one
    stream per rank (sections 3 to 16), batches as the reference's per-rank stream; set explicitly, it refuses."""
    data = tmp_path / "many"
    gen_megatron.main([str(data), "--shards", "2", "--docs-per-shard", "700", "--seed", "3"])
    d = daemon(feed_conf("big", f"{data}/shard_*.idx", vranks=None))
    got = d.dump("big", tmp_path / "o", rank=1030, world=1100, batches=3)
    assert_batches_equal(got, reference(f"{data}/shard_*.idx", 1030, 1100, 3))
    d2 = daemon(feed_conf("big", f"{data}/shard_*.idx", vranks=1024))
    p = d2.dump("big", tmp_path / "o2", rank=0, world=1100, batches=1, check=False)
    assert p.returncode == 1 and "has 1024 virtual ranks" in p.stderr and "raise virtual_ranks" in p.stderr, p.stderr


def test_pread_fallback_serves_the_same_batches(daemon, dataset, tmp_path):
    conf = feed_conf("web", f"{dataset}/shard_*.idx")
    a = daemon("[feedd]\nio_engine = pread\n" + conf)
    assert a.status()["daemon"]["io_engine"] == "pread"
    got = a.dump("web", tmp_path / "p", batches=20)
    assert_batches_equal(got, reference(f"{dataset}/shard_*.idx", 0, 1, 20))


def test_status_shows_attached_clients_and_no_fd_leaks(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"))
    base_fds = open_fds(d.proc.pid)
    holder = d.client("web", 1, 2, 1000, hold=True)
    assert holder.stdout.readline().strip() == "attached"
    line = ""
    while not line.startswith("holding"):
        line = holder.stdout.readline()
        assert line, holder.stderr.read()
    st = d.status()
    (c,) = st["clients"]
    assert c["pid"] == holder.pid and c["feed"] == "web" and (c["rank"], c["world"]) == (1, 2)
    assert c["batches_delivered"] == 4 and c["ring_fill"] == 4 and c["ring_slots"] == 4
    assert st["feeds"][0]["clients"] == 1
    table = d.ctl("status").stdout
    assert "web" in table and str(holder.pid) in table and "1/2" in table
    holder.kill()
    holder.wait()
    deadline = time.time() + 5
    while time.time() < deadline and d.status()["clients"]:
        time.sleep(0.05)
    assert d.status()["clients"] == []
    assert open_fds(d.proc.pid) == base_fds, "feedd leaked file descriptors after a client died"


def test_sigterm_tells_attached_clients(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"))
    # reconnect_ms=0: the daemon's words reach a trainer that turned reconnecting off (the default waits for the
    # next daemon: test_reconnect.py).
    c = d.client("web", 0, 1, 100000, sleep_ms=20, reconnect_ms=0)
    assert c.stdout.readline().strip() == "attached"
    time.sleep(0.2)
    t0 = time.time()
    assert d.stop() == 0
    out, _ = c.communicate(timeout=10)
    assert time.time() - t0 < 5
    assert c.returncode == 1 and "stopping" in out, out


def test_a_client_that_stops_consuming_does_not_slow_another(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"), threads=1)
    holder = d.client("web", 0, 2, 1000, hold=True)
    line = ""
    while not line.startswith("holding"):
        line = holder.stdout.readline()
        assert line, holder.stderr.read()
    t0 = time.time()
    got = d.dump("web", tmp_path / "free", rank=1, world=2, batches=200)
    assert time.time() - t0 < 20
    assert_batches_equal(got, reference(f"{dataset}/shard_*.idx", 1, 2, 200))
    (h,) = [c for c in d.status()["clients"] if c["pid"] == holder.pid]
    assert h["ring_fill"] == h["ring_slots"]
    holder.kill()
    holder.wait()
