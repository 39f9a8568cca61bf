# SPDX-License-Identifier: MIT
"""The `feed` Python package (client/python) against a real feedd and real shards.

Runs with Debian's /usr/bin/python3 (python3-torch, python3-numpy). The
package is imported from the source tree and loads libfeed from
$FEEDD_BUILD_DIR/client. Expected batches come from `feedctl dump`, which
test_megatron_stream.py checks against the independent reference.
"""

import errno
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (BUILD, FEED_INSTALLED, SRC, Daemon, feed_conf, gen_megatron, reference_virtual,
                      use_feed_package)

os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
FEED_PATH = use_feed_package()
import feed  # noqa: E402
import torch  # noqa: E402

WORKER = Path(__file__).with_name("py_worker.py")
KEYS = ("input_ids", "labels", "position_ids")


def test_the_package_under_test_is_imported():
    """From the source tree by default; the installed one (a wheel in a venv) with FEED_TEST_INSTALLED=1."""
    under_src = Path(feed.__file__).resolve().is_relative_to(SRC)
    assert under_src != FEED_INSTALLED, (feed.__file__, FEED_INSTALLED)
    if FEED_INSTALLED:  # the wheel's own libfeed, not the build tree's
        assert Path(feed._lib.lib.path).parent == Path(feed.__file__).parent, feed._lib.lib.path


def as_np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def assert_matches_dump(batches, dump, first=0):
    """batches[i] must be batch first+i of the dump, byte for byte, cursor included."""
    for i, b in enumerate(batches):
        j = first + i
        for k in KEYS:
            assert np.array_equal(as_np(b[k]), dump[k][j]), f"batch {j}: {k} differs from feedctl dump"
        assert np.array_equal(as_np(b["cu_seqlens"]), dump["cu_seqlens"][j]), f"batch {j}: cu_seqlens differ"
        assert b.cursor == dump["cursors"][j], f"batch {j}: cursor differs"


def worker_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    env["PYTHONPATH"] = FEED_PATH
    env["FEEDD_BUILD_DIR"] = str(BUILD)
    env.update(kw)
    return env


@pytest.fixture
def web(daemon, dataset):
    return daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256))


@pytest.mark.parametrize("mode", ["torch", "numpy", "copy"])
def test_batches_equal_feedctl_dump(web, tmp_path, mode):
    dump = web.dump("web", tmp_path / "d", rank=1, world=3, batches=12)
    kw = {"numpy": {"as_numpy": True}, "copy": {"copy": True}}.get(mode, {})
    loader = feed.Loader("web", rank=1, world_size=3, socket=web.socket, labels="shifted", **kw)
    got = [next(loader) for _ in range(4)]  # as many as the ring has slots, all alive at once
    assert_matches_dump(got, dump)
    b = got[0]
    assert b.index == 0 and b.rank == 1 and b.world_size == 3 and b.labels_convention == "shifted"
    assert tuple(b["input_ids"].shape) == (4, 256) and tuple(b["cu_seqlens"].shape) == (len(dump["cu_seqlens"][0]),)
    if mode == "torch":
        assert all(isinstance(v, torch.Tensor) and v.dtype == torch.int32 for v in b.values())
    elif mode == "numpy":
        assert all(isinstance(v, np.ndarray) and v.dtype == np.int32 and not v.flags.writeable for v in b.values())
    else:
        b["input_ids"][0, 0] = -1  # private copies are writable
    del got, b
    # The rest of the stream, then a resume from batch 4's cursor.
    for i in range(4, 12):
        assert_matches_dump([next(loader)], dump, first=i)
    loader.load_state_dict({**loader.state_dict(), "cursor": dump["cursors"][4], "next_batch": 5})
    for i in range(5, 12):
        assert_matches_dump([next(loader)], dump, first=i)


def test_the_default_virtual_ranks_through_the_loader_equal_the_contract(daemon, dataset):
    """feedd's default virtual_ranks (1024, section 17): the loader's batches are the reference's, its states
    (fv1, longer than a cursor: the slot's state area) resume exactly, and len() answers (section 17.10)."""
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256, vranks=None))
    exp = reference_virtual(f"{dataset}/shard_*.idx", 1, 2, 14, eos=50256)
    a = feed.Loader("web", rank=1, world_size=2, socket=d.socket, as_numpy=True, copy=True, labels="shifted")
    assert len(a) > 0
    got = [next(a) for _ in range(14)]
    for b, e in zip(got, exp):
        for k in KEYS:
            assert np.array_equal(b[k], e[k]), (b.index, k)
    assert got[8].cursor.startswith("fv1-") and len(got[8].cursor) > 511
    b = feed.Loader("web", rank=1, world_size=2, socket=d.socket, as_numpy=True, copy=True, labels="shifted")
    b.load_state_dict({**a.state_dict(), "cursor": got[8].cursor, "next_batch": 9})
    for i in range(9, 14):
        x = next(b)
        assert x.index == i and all(np.array_equal(x[k], exp[i][k]) for k in KEYS), i
    a.close()
    b.close()


def test_state_dict_round_trip_mid_epoch(web, tmp_path):
    a = feed.Loader("web", rank=0, world_size=2, socket=web.socket)
    assert a.state_dict()["cursor"] is None and a.state_dict()["next_batch"] == 0
    for _ in range(7):
        last = next(a)
    # Committed on delivery: the state names the batch the user holds now.
    sd = a.state_dict()
    assert sd["cursor"] == last.cursor and sd["next_batch"] == 7 == last.index + 1
    assert last.epoch == 0, "the test means to cut mid-epoch"
    del last
    cont = [next(a).clone() for _ in range(6)]

    sd = pickle.loads(pickle.dumps(json.loads(json.dumps(sd))))  # survives torch.save/JSON checkpoints
    b = feed.Loader("web", rank=0, world_size=2, socket=web.socket)
    next(b)  # a loader that already moved elsewhere
    b.load_state_dict(sd)
    again = [next(b).clone() for _ in range(6)]
    for x, y in zip(cont, again):
        assert x.index == y.index
        for k in (*KEYS, "cu_seqlens"):
            assert torch.equal(x[k], y[k]), k
    assert [x.cursor for x in cont] == [y.cursor for y in again]
    assert b.state_dict()["next_batch"] == 13


def test_state_of_another_feed_or_world_is_refused(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx") + "\n" + feed_conf("other", f"{dataset}/shard_00[01].idx"))
    a = feed.Loader("web", rank=0, world_size=2, socket=d.socket)
    for _ in range(3):
        next(a)
    sd = a.state_dict()
    with pytest.raises(feed.StateError, match="world 2.*world 4"):
        feed.Loader("web", rank=0, world_size=4, socket=d.socket).load_state_dict(sd)
    with pytest.raises(feed.StateError, match="feed 'web'.*feed 'other'"):
        feed.Loader("other", rank=0, world_size=2, socket=d.socket).load_state_dict(sd)
    with pytest.raises(feed.StateError, match="rank 0 of world 2.*rank 1 of world 2"):
        feed.Loader("web", rank=1, world_size=2, socket=d.socket).load_state_dict(sd)
    # Relabelled to pass the local check: feedd refuses it with its own reason.
    o = feed.Loader("other", rank=0, world_size=2, socket=d.socket)
    first = next(o).clone()
    with pytest.raises(feed.StateError, match="fingerprint") as e:
        o.load_state_dict({**sd, "feed": "other"})
    assert e.value.code == -errno.EINVAL
    # A refused state leaves the loader where it was.
    assert o.state_dict()["next_batch"] == 1 and next(o).index == 1
    fresh = feed.Loader("other", rank=0, world_size=2, socket=d.socket)
    assert torch.equal(next(fresh)["input_ids"], first["input_ids"])
    with pytest.raises(feed.StateError, match="not a feed.Loader state_dict"):
        a.load_state_dict({"cursor": "x"})


def test_two_ranks_get_disjoint_documents(daemon, tmp_path):
    """Documents are runs of one id separated by eos; ranks 0/1 of 2 run as separate processes,
    rank and world taken from torchrun's and Slurm's variables."""
    data = tmp_path / "ids"
    data.mkdir()
    rng = np.random.default_rng(4)
    ids = iter(range(2, 10**6))
    for s in range(3):
        gen_megatron.write_shard(str(data / f"s{s}"), [[np.full(int(n), next(ids))] for n in
                                                       rng.integers(1, 200, 60)], "i32")
    d = daemon(feed_conf("ids", f"{data}/s*.idx", seq_len=128, batch_size=2, eos=1))
    envs = [worker_env(RANK="0", WORLD_SIZE="2"), worker_env(SLURM_PROCID="1", SLURM_NTASKS="2")]
    procs = [subprocess.Popen([sys.executable, str(WORKER), "dump", d.socket, "ids", "20",
                               str(tmp_path / f"r{r}.npz")], env=envs[r], stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    docs = []
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        got = np.load(tmp_path / f"r{r}.npz")
        meta = json.loads(str(got["meta"]))
        assert (meta["rank"], meta["world"]) == (r, 2)
        dump = d.dump("ids", tmp_path / f"d{r}", rank=r, world=2, batches=20)
        for k in KEYS:
            assert np.array_equal(got[k], dump[k]), f"rank {r}: {k} differs from feedctl dump"
        stream = got["input_ids"].reshape(-1)
        docs.append(set(int(t) for t in stream if t != 1))
    assert len(docs[0]) > 20 and len(docs[1]) > 20
    assert not docs[0] & docs[1], "a document was delivered to both ranks"


def test_telemetry_appears_in_status_without_user_code(web):
    loader = feed.Loader("web", socket=web.socket)
    n, step = 15, 0.02
    for _, _batch in zip(range(n), loader):
        time.sleep(step)  # the "training step"
    mine = [c for c in web.status()["clients"] if c["pid"] == os.getpid()]
    local = loader.stats()
    assert len(mine) == 1, mine
    c = mine[0]
    assert c["batches_delivered"] == local["batches"] == n
    # The daemon reads the counters libfeed keeps: the same figures, no message sent.
    assert c["wait_s"] == pytest.approx(local["wait_s"], abs=1e-6)
    assert c["step_s"] == pytest.approx(local["step_s"], abs=1e-6)
    assert c["stall_pct"] == pytest.approx(local["stall_pct"], abs=1e-3)
    assert (n - 1) * step <= local["step_s"] < (n - 1) * step + 1.0
    assert local["step_p50_s"] == pytest.approx(step, rel=0.5)
    assert local["wait_p50_s"] is not None and local["wait_p99_s"] >= local["wait_p50_s"]
    loader.report(step_time=0.5, h2d_time=0.25)
    loader.report(step_time=0.5)
    s = loader.stats()
    assert s["reported_step_s"] == pytest.approx(1.0) and s["h2d_s"] == pytest.approx(0.25)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGKILL while waiting", "SIGTERM"])
def test_daemon_gone_raises_within_a_second(dataset, tmp_path, how):
    d = Daemon(tmp_path, feed_conf("web", f"{dataset}/shard_*.idx"), name="gone")
    try:
        loader = feed.Loader("web", socket=d.socket, timeout=30, reconnect_timeout=0)  # reconnect disabled
        for _ in range(3):
            b = next(loader)  # batch 2; the loop below may take more, or none if the ring was empty at the kill
        kill_at = [None]

        def kill():
            if how == "SIGTERM":
                d.proc.send_signal(signal.SIGTERM)
            else:
                d.proc.kill()
            kill_at[0] = time.monotonic()

        if how == "SIGKILL while waiting":
            # A frozen daemon publishes nothing: the loader drains the ring and blocks in next().
            d.proc.send_signal(signal.SIGSTOP)
            threading.Timer(0.5, kill).start()
        else:
            kill()
        with pytest.raises(feed.DaemonGoneError) as e:
            for _ in range(10000):
                b = next(loader)
        gone = time.monotonic()
        assert kill_at[0] is not None and gone - kill_at[0] < 1.0, f"raised {gone - kill_at[0]:.2f} s after the kill"
        assert ("stopping" if how == "SIGTERM" else "closed the connection") in str(e.value)
        with pytest.raises(feed.DaemonGoneError):  # and stays raised
            next(loader)
        if how != "SIGKILL while waiting":
            assert b.index >= 2 and int(b["input_ids"].sum()) >= 0  # batches already taken stay readable
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
        d.proc.wait()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_batch_held_through_the_daemons_end_does_not_change(dataset, tmp_path, how):
    """A trainer's zero-copy batch outlives feedd (a restart, a stop): it stays what it was. feedd stopping
    once wiped every ring for reuse (its idle-ring pool) while clients still mapped them: the held batch read
    zeros, and the cursor libfeed resumes from, read from the slot, was empty (a restart from batch 0)."""
    d = Daemon(tmp_path, feed_conf("web", f"{dataset}/shard_*.idx"), name="held")
    try:
        loader = feed.Loader("web", socket=d.socket, timeout=30, reconnect_timeout=0, as_numpy=True)
        held = [next(loader) for _ in range(2)][-1]  # slots stay taken while referenced
        before = {k: np.array(held[k]) for k in KEYS}
        cursor = held.cursor
        assert before["input_ids"].any()
        d.proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
        d.proc.wait(timeout=10)
        time.sleep(0.2)
        for k, v in before.items():
            assert np.array_equal(np.array(held[k]), v), f"{k} of a held batch changed after the daemon's {how}"
        assert held.cursor == cursor
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
        d.proc.wait()


def test_zero_copy_batches_keep_their_slot_while_referenced(web, tmp_path):
    dump = web.dump("web", tmp_path / "d", batches=30)
    loader = feed.Loader("web", socket=web.socket, labels="shifted")
    assert loader.slots == 4
    ids0 = next(loader)["input_ids"]  # only one tensor kept: the batch dict itself is gone
    first_copy = ids0.clone()
    for i in range(1, 4):
        if i == 2:  # the loop moved past batch 0 while it is still alive: said once, before the ring runs out
            with pytest.warns(RuntimeWarning, match="batch 0 is still referenced after the loop moved on"):
                b = next(loader)
        else:
            b = next(loader)
        assert_matches_dump([b], dump, first=i)
        assert torch.equal(ids0, first_copy), "a held tensor was overwritten by a later batch"
    # Slots go back in order: ids0 holds its own and the three after it.
    assert loader.held == 4
    with pytest.raises(feed.SlotsExhaustedError, match="all 4 ring slots are taken: batch 0 is still referenced"):
        next(loader)
    assert np.array_equal(ids0.numpy(), dump["input_ids"][0])
    del ids0
    for i in range(4, 12):
        b = next(loader)
        assert_matches_dump([b], dump, first=i)
    assert loader.held == 1  # only the current batch: the others went back to feedd
    kept = [b] + [next(loader) for _ in range(3)]  # batches 11..14: 4 of 4 slots referenced
    with pytest.raises(feed.SlotsExhaustedError, match="batch 11"):
        next(loader)
    del b, kept[0]
    nxt = next(loader)
    assert nxt.index == 15
    assert_matches_dump(kept + [nxt], dump, first=12)
    del kept, nxt
    # A batch kept alive only by a reference cycle: no garbage collection inside next() (a full pause in a
    # training step), the error says so; after the user's gc.collect() the stream goes on.
    gc.disable()
    try:
        cyc = [next(loader)]
        cyc.append(cyc)
        del cyc
        more = [next(loader) for _ in range(3)]  # with batch 16 in the cycle: 4 of 4 slots
        with pytest.raises(feed.SlotsExhaustedError, match="batch 16 .*gc.collect"):
            next(loader)
        gc.collect()
        more.append(next(loader))
    finally:
        gc.enable()
    assert_matches_dump(more, dump, first=17)
    del more
    # copy=True: private, writable batches that hold no slot.
    c = feed.Loader("web", socket=web.socket, copy=True, labels="shifted")
    many = [next(c) for _ in range(10)]
    assert c.held == 0
    many[0]["input_ids"] += 1
    assert np.array_equal(many[0]["input_ids"].numpy() - 1, dump["input_ids"][0])
    assert_matches_dump(many[1:], dump, first=1)


def test_writing_a_zero_copy_tensor_faults(web):
    """The ring is mapped read-only: a write kills the writer, it never reaches another reader."""
    p = subprocess.run([sys.executable, str(WORKER), "write", web.socket, "web"], env=worker_env(),
                       capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_CORE, (0, 0)))
    assert p.returncode == -signal.SIGSEGV, (p.returncode, p.stdout, p.stderr)
    assert "writing" in p.stdout and "wrote" not in p.stdout


def test_numpy_without_torch(web):
    p = subprocess.run([sys.executable, str(WORKER), "notorch", web.socket, "web"], env=worker_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "torch-mode refused: feed.Loader yields torch tensors" in p.stdout
    assert "ndarray (4, 256) False False" in p.stdout


def test_errors_carry_the_daemons_message(web, tmp_path, monkeypatch):
    with pytest.raises(feed.FeedNotFoundError, match="no feed named 'nosuch'") as e:
        feed.Loader("nosuch", socket=web.socket)
    assert e.value.code == -errno.ENOENT
    with pytest.raises(feed.DaemonGoneError, match="cannot reach feedd at .*nothere.sock"):
        feed.Loader("web", socket=str(tmp_path / "nothere.sock"))
    # No daemon has device 255: refused with the daemon's reason, GPU or not (tests/gpu covers the rest).
    with pytest.raises(feed.DeviceUnavailableError, match="cuda:255"):
        feed.Loader("web", socket=web.socket, device="cuda:255")
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        feed.Loader("web", rank=2, world_size=2, socket=web.socket)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match=r"\$RANK='x'"):
        feed.Loader("web", socket=web.socket)
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"rank 5 is not in a world of size 3 \(from \$RANK, \$WORLD_SIZE\)"):
        feed.Loader("web", socket=web.socket)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("FEEDD_SOCKET", web.socket)
    lo = feed.Loader("web")
    assert (lo.rank, lo.world_size) == (2, 3) and next(lo).rank == 2
    lo.close()
    with pytest.raises(feed.FeedError, match="closed"):
        next(lo)
    # A daemon that is alive but delivers nothing: the loader's timeout, not a hang.
    slow = feed.Loader("web", socket=web.socket, timeout=0.2)
    web.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(feed.FeedTimeoutError, match="within 0.2 s"):
            for _ in range(10):  # the ring's published batches first
                next(slow)
    finally:
        web.proc.send_signal(signal.SIGCONT)


def test_close_keeps_live_batches_readable_and_leaks_nothing(web, tmp_path):
    dump = web.dump("web", tmp_path / "d", batches=3)
    gc.collect()
    base = sorted(os.listdir("/proc/self/fd"))
    loader = feed.Loader("web", socket=web.socket, labels="shifted")
    next(loader)
    b = next(loader)
    assert len(os.listdir("/proc/self/fd")) > len(base)  # the socket and two eventfds
    loader.close()
    # The ring stays mapped while a batch of it is alive...
    assert_matches_dump([b], dump, first=1)
    assert any(c["pid"] == os.getpid() for c in web.status()["clients"])
    # ...and is unmapped, with every fd closed and the session gone, after the last one.
    del b
    assert sorted(os.listdir("/proc/self/fd")) == base
    deadline = time.time() + 5
    while time.time() < deadline and web.status()["clients"]:
        time.sleep(0.05)
    assert web.status()["clients"] == []


@pytest.mark.parametrize("reply", ["refused", "newer header"])
def test_a_daemon_of_another_protocol_version_is_named(tmp_path, reply):
    """A stand-in daemon on a real socket answers HELLO as a feedd of protocol version 2 would: with ERROR
    -EPROTONOSUPPORT in feedd's words (what feedd sends today to a client it cannot speak with), or with a
    message whose header says version 2. The loader raises ProtocolMismatchError naming both sides."""
    import socket as so
    import struct
    path = str(tmp_path / "v2.sock")
    srv = so.socket(so.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        c.recv(4096)  # HELLO
        text = b"protocol versions 1..1 are not supported (this daemon speaks 2)"
        payload = struct.pack("<iI", -errno.EPROTONOSUPPORT, 0) + text.ljust(512, b"\0")
        version = 1 if reply == "refused" else 2
        c.sendall(struct.pack("<IHHII", 0x57444546, version, 5, len(payload), 0) + payload)
        time.sleep(0.5)
        c.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        with pytest.raises(feed.ProtocolMismatchError) as e:
            feed.Loader("web", socket=path)
    finally:
        t.join()
        srv.close()
    assert isinstance(e.value, ConnectionError) and e.value.code == -errno.EPROTONOSUPPORT
    assert f"this feed package (version {feed.__version__}, libfeed {feed._lib.lib.path})" in str(e.value)
    if reply == "refused":
        assert str(e.value).startswith("protocol versions 1..1 are not supported (this daemon speaks 2)")
