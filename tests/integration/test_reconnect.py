# SPDX-License-Identifier: MIT
"""Trainers outlive feedd (issue 17): libfeed reconnects on its own.

Four clients, two C (tests/integration/stream-client, with libfeed's
default reconnect_timeout: nothing set, no environment variable) and two
Python (feed.Loader with its default reconnect_timeout), on two feeds, read
while feedd is SIGKILLed at random
points (KILLS times), SIGTERMed (TERMS times) and once restarted under
systemd-socket-activate (the listening socket exists before the daemon
does). No client sees an error, and each client's whole sequence of
batches is bit-identical to an undisturbed run's. The counts are chosen to
keep the test well under three minutes on a loaded two-core machine.

The second feed is a JSONL feed tokenized online (cl100k_base) when
build/tokdata/ranks/cl100k_base.tiktoken exists (scripts/fetch-tok-data.sh),
else a second Megatron feed (the test says which).

Also: a daemon that comes back without the feed refuses the re-attach, and
the client gets its reason at once, not after reconnect_timeout; one that
does not come back is named after the timeout ($FEED_RECONNECT_TIMEOUT
bounds it, 0 turns it off); Ctrl-C (Python) and SIGTERM (C) during the
backoff act at once; examples/train_c trains on through restarts with
nothing set; a device loader (with host fallback here: no GPU) attaches
again as a device loader and reads on bit-identically.
"""

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUILD, FEEDCTL, STREAM_CLIENT, FEEDD, Daemon, feed_conf, use_feed_package
from test_crash import Drained, batches

KILLS = int(os.environ.get("FEEDD_RECONNECT_KILLS", "20"))
TERMS = 3
ACTIVATE = shutil.which("systemd-socket-activate")
RANKS = BUILD / "tokdata" / "ranks" / "cl100k_base.tiktoken"
TEXT = RANKS.exists()
FEED2 = "text" if TEXT else "code"  # the second feed of the four clients

PY_WORKER = r"""
import hashlib, os, sys, time
import feed
sock, name, rank, world, stop, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
loader = feed.Loader(name, rank=rank, world_size=world, socket=sock, as_numpy=True, timeout=120)
print("attached", flush=True)
n = 0
for b in loader:
    h = hashlib.sha1()
    for k in ("input_ids", "labels", "position_ids"):
        h.update(b[k].tobytes())
    print(f"batch {b.index} {b.epoch} {h.hexdigest()[:16]} {b.cursor}", flush=True)
    del b
    n += 1
    if n == limit or os.path.exists(stop):
        break
    time.sleep(0.002)
s = loader.stats()
print(f"stats {s['reconnects']} {s['reconnect_s']:.3f} {s['batches']}", flush=True)
print("done", flush=True)
"""


def conf():
    c = (feed_conf("web", f"{DATASET}/shard_*.idx", eos=50256, seed=7) +
         feed_conf("code", f"{DATASET}/shard_*.idx", seq_len=128, batch_size=2, seed=99, eos=50256))
    if TEXT:
        c = (f"[feedd]\ncache_dir = {DATASET}/tokcache\n" + c +
             f"[feed.text]\nformat = jsonl\nshards = {DATASET}/text/*.jsonl\ntokenizer = {RANKS}\n"
             "tokenizer_preset = cl100k_base\nseq_len = 128\nbatch_size = 2\nseed = 5\nshuffle = true\n"
             "shuffle_window = 2\nbos = none\neos = <|endoftext|>\n")
    return c


def write_text_corpus(root):
    """Two JSONL shards of made-up prose, the same on every run."""
    rng = random.Random(5)
    words = ("the of and to in is was for on that with as by at from feed daemon ring batch token shard cursor "
             "stream rank world epoch restart reconnect trainer GPU memory socket café naïve 東京 2026 3.14 "
             "don't it's ...").split()
    (root / "text").mkdir(exist_ok=True)
    for s in range(2):
        with open(root / "text" / f"part{s}.jsonl", "w") as f:
            for _ in range(400):
                n = rng.randint(5, 400)
                f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")


def py_client(sock, name, rank, world, stop, limit=1_000_000):
    env = {**os.environ, "PYTHONPATH": use_feed_package(), "FEEDD_BUILD_DIR": str(STREAM_CLIENT.parents[2])}
    return subprocess.Popen([sys.executable, "-c", PY_WORKER, sock, name, str(rank), str(world), str(stop),
                             str(limit)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def c_client(sock, name, rank, world, batches_=1_000_000, sleep_ms=2, reconnect_ms=None, by_env=False):
    """reconnect_ms None: libfeed's default (300 s), nothing set. by_env: $FEED_RECONNECT_TIMEOUT (seconds),
    as an operator sets it for a trainer without code for it; else feed_client_set_reconnect_timeout()."""
    env = {k: v for k, v in os.environ.items() if k not in ("FEED_RECONNECT_TIMEOUT", "STREAM_RECONNECT_MS")}
    if reconnect_ms is not None:
        env.update({"FEED_RECONNECT_TIMEOUT": str(reconnect_ms / 1000)} if by_env else
                   {"STREAM_RECONNECT_MS": str(reconnect_ms)})
    return subprocess.Popen([str(STREAM_CLIENT), sock, name, str(rank), str(world), str(batches_), "-",
                             str(sleep_ms), "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


DATASET = None


@pytest.fixture
def data(dataset):
    global DATASET
    DATASET = dataset
    if TEXT and not (dataset / "text").exists():
        write_text_corpus(dataset)
    return dataset


class Activated:
    """feedd under systemd-socket-activate: the socket listens before the daemon runs."""

    def __init__(self, tmp, sock):
        self.conf = tmp / "activated.conf"
        self.conf.write_text(conf())
        if os.path.exists(sock):
            os.unlink(sock)
        self.proc = subprocess.Popen([ACTIVATE, "-l", sock, str(FEEDD), "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=open(tmp / "activated.log", "w"))
        deadline = time.time() + 10
        while not os.path.exists(sock):
            assert self.proc.poll() is None and time.time() < deadline, "systemd-socket-activate did not listen"
            time.sleep(0.01)


def test_clients_read_on_through_kills_terms_and_a_socket_activated_restart(tmp_path, data):
    rng = random.Random(17)
    d = Daemon(tmp_path, conf(), name="feedd")
    sock = d.socket
    stop = tmp_path / "stop"
    clients = {
        "c web 0/2": Drained(c_client(sock, "web", 0, 2)),
        "c FEED2 0/1": Drained(c_client(sock, FEED2, 0, 1, sleep_ms=1)),
        "py web 1/2": Drained(py_client(sock, "web", 1, 2, stop)),
        "py FEED2 0/1": Drained(py_client(sock, FEED2, 0, 1, stop)),
    }
    try:
        for who, c in clients.items():
            assert c.wait_for_line("attached"), f"{who} did not attach: {c.err()}"
        plan = ["KILL"] * KILLS + ["TERM"] * TERMS
        rng.shuffle(plan)
        procs = [d.proc]
        for i, how in enumerate(plan):
            time.sleep(rng.uniform(0.05, 0.4))
            d.proc.send_signal(signal.SIGKILL if how == "KILL" else signal.SIGTERM)
            d.proc.wait(timeout=30)
            time.sleep(rng.uniform(0.0, 0.3))  # clients back off meanwhile
            d = Daemon(tmp_path, conf(), name="feedd")
            procs.append(d.proc)
        if ACTIVATE:
            time.sleep(0.2)
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            a = Activated(tmp_path, sock)
            procs.append(a.proc)
        time.sleep(1.0)
        # feedctl status, from the daemon now serving: the C clients' reconnects, counted by libfeed.
        deadline = time.time() + 10
        while True:
            p = subprocess.run([str(FEEDCTL), "--socket", sock, "status", "--json"], capture_output=True, text=True,
                               timeout=60)
            seen = {c["pid"]: (c["reconnects"], c["reconnect_s"]) for c in json.loads(p.stdout)["clients"]}
            mine = [seen.get(clients[who].proc.pid, (0, 0)) for who in ("c web 0/2", "c FEED2 0/1")]
            if all(n >= 3 and s_ > 0 for n, s_ in mine) or time.time() > deadline:
                break
            time.sleep(0.2)
        assert all(n >= 3 and s_ > 0 for n, s_ in mine), f"C clients' reconnects in feedctl status: {mine}"
        stop.touch()
        for who in ("py web 1/2", "py FEED2 0/1"):
            clients[who].proc.wait(timeout=120)
        for who in ("c web 0/2", "c FEED2 0/1"):
            clients[who].proc.send_signal(signal.SIGTERM)
            clients[who].proc.wait(timeout=30)
        if ACTIVATE:
            a.proc.send_signal(signal.SIGTERM)
            a.proc.wait(timeout=30)
        else:
            d.stop()
    finally:
        for c in clients.values():
            if c.proc.poll() is None:
                c.proc.kill()
        for p in procs:
            if p.poll() is None:
                p.kill()

    got = {}
    for who, c in clients.items():
        out, err = c.text(), c.err()
        assert "error" not in out and "Traceback" not in err, f"{who} failed: {out[-300:]} {err[-1500:]}"
        got[who] = batches(out)
        assert [g[0] for g in got[who]] == list(range(len(got[who]))), f"{who}: batch indices not contiguous"
        assert len(got[who]) > 50, f"{who} read only {len(got[who])} batches"
        if who.startswith("py"):
            stats = [line.split() for line in out.splitlines() if line.startswith("stats ")]
            # A daemon that lives less than a client's backoff may go unseen: not every death is a reconnect.
            assert stats and int(stats[0][1]) >= 3, f"{who}: reconnects {stats}"

    # The undisturbed runs: a fresh daemon, the same clients, as many batches.
    d = Daemon(tmp_path, conf(), name="clean")
    try:
        clean = {
            "c web 0/2": c_client(d.socket, "web", 0, 2, len(got["c web 0/2"]), sleep_ms=0, reconnect_ms=0),
            "c FEED2 0/1": c_client(d.socket, FEED2, 0, 1, len(got["c FEED2 0/1"]), sleep_ms=0, reconnect_ms=0),
            "py web 1/2": py_client(d.socket, "web", 1, 2, tmp_path / "never", len(got["py web 1/2"])),
            "py FEED2 0/1": py_client(d.socket, FEED2, 0, 1, tmp_path / "never", len(got["py FEED2 0/1"])),
        }
        for who, p in clean.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"clean {who}: {err}"
            want = batches(out)
            assert len(want) == len(got[who])
            for (i, h, cur), (_, wh, wcur) in zip(got[who], want):
                assert (h, cur) == (wh, wcur), f"{who}: batch {i} differs from the undisturbed run"
    finally:
        assert d.stop() == 0
    print({who: len(g) for who, g in got.items()},
          f"{KILLS} kills, {TERMS} terms, activated: {bool(ACTIVATE)}, second feed: {FEED2}")


@pytest.mark.parametrize("change", ["feed removed", "data changed"])
def test_a_daemon_back_that_refuses_says_why_at_once(tmp_path, data, change):
    d = Daemon(tmp_path, conf(), name="feedd")
    c = Drained(c_client(d.socket, "code", 0, 1, sleep_ms=1))  # the default: 300 s
    try:
        assert c.wait_for_line("attached")
        time.sleep(0.3)
        d.proc.kill()
        d.proc.wait()
        if change == "feed removed":
            new = feed_conf("web", f"{DATASET}/shard_*.idx", eos=50256, seed=7)
        else:  # another order of the same shards: the cursor's fingerprint no longer matches
            new = feed_conf("code", f"{DATASET}/shard_*.idx", seq_len=128, batch_size=2, seed=100, eos=50256)
        d = Daemon(tmp_path, new, name="feedd")
        t0 = time.time()
        c.proc.wait(timeout=30)
        took = time.time() - t0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
        d.stop()
    out = c.text()
    assert c.proc.returncode == 1, out[-300:]
    last = out.splitlines()[-1]
    assert last.startswith("error") and "refused" in last and "code" in last, last
    assert ("no feed named" in last) if change == "feed removed" else ("no feed named" not in last), last
    assert took < 10, f"the refusal took {took:.1f} s"
    print(last)


def ring_maps():
    return {line.split()[0] for line in open("/proc/self/maps") if "memfd:feedd-ring" in line}


def test_held_batches_stay_valid_across_a_restart(tmp_path, data):
    os.environ.setdefault("FEEDD_BUILD_DIR", str(STREAM_CLIENT.parents[2]))
    use_feed_package()
    import feed
    import numpy as np

    d = Daemon(tmp_path, conf(), name="feedd")
    try:
        loader = feed.Loader("web", socket=d.socket, as_numpy=True, timeout=60, reconnect_timeout=60)
        held = [next(loader) for _ in range(3)]  # zero-copy views into the first daemon's ring (3 of 4 slots)
        copies = [b["input_ids"].copy() for b in held]
        d.proc.kill()
        d.proc.wait()
        d = Daemon(tmp_path, conf(), name="feedd")
        # The 4th slot was published before the kill: it comes from the old ring. Then one slot is
        # given back (batch 0), and the next next() reconnects with batches 1..3 held in the old ring.
        held.append(next(loader))
        copies.append(held[-1]["input_ids"].copy())
        del held[0], copies[0]
        after = [next(loader).clone()]
        assert loader.stats()["reconnects"] == 1
        assert len(ring_maps()) == 2, "the old ring must stay mapped while batches in it are held"
        for b, c in zip(held, copies):
            assert np.array_equal(b["input_ids"], c), "a held batch changed across the reconnect"
        del held, b
        after += [next(loader).clone() for _ in range(4)]
        # Once its batches are released the old ring is unmapped: one ring mapped, the new daemon's.
        assert len(ring_maps()) == 1, ring_maps()
        s = loader.stats()
        assert s["reconnects"] >= 1 and s["reconnect_s"] > 0, s
        mine = [c for c in d.status()["clients"] if c["pid"] == os.getpid()]
        assert [(c["reconnects"], c["reconnect_s"] > 0) for c in mine] == [(1, True)], mine  # feedctl status
        assert re.search(r"\(web rank 0/1\): reconnected 1 times to a restarted feedd, [0-9.]+ s waiting",
                         d.ctl("status").stdout), d.ctl("status").stdout
        assert [b.index for b in after] == list(range(4, 4 + len(after)))
        ref = feed.Loader("web", socket=d.socket, as_numpy=True, reconnect_timeout=0)
        want = [next(ref).clone() for _ in range(4 + len(after))][4:]
        for a, w in zip(after, want):
            assert np.array_equal(a["input_ids"], w["input_ids"]) and a.cursor == w.cursor
        ref.close()
        loader.close()
    finally:
        d.stop()


def test_python_gets_the_refusal_as_its_exception(tmp_path, data):
    os.environ.setdefault("FEEDD_BUILD_DIR", str(STREAM_CLIENT.parents[2]))
    use_feed_package()
    import feed

    d = Daemon(tmp_path, conf(), name="feedd")
    try:
        loader = feed.Loader("code", socket=d.socket, as_numpy=True, timeout=60)  # the default reconnect_timeout
        for _ in range(3):
            next(loader)
        d.proc.kill()
        d.proc.wait()
        d = Daemon(tmp_path, feed_conf("code", f"{DATASET}/shard_*.idx", seq_len=128, batch_size=2, seed=100,
                                       eos=50256), name="feedd")
        t0 = time.time()
        with pytest.raises(feed.StateError, match="refused to attach feed \"code\" again"):
            for _ in range(100):
                next(loader)
        assert time.time() - t0 < 10
        loader.close()
    finally:
        d.stop()


def test_a_daemon_that_does_not_come_back_is_named_after_the_timeout(tmp_path, data):
    os.environ.setdefault("FEEDD_BUILD_DIR", str(STREAM_CLIENT.parents[2]))
    use_feed_package()
    import feed

    with pytest.raises(ValueError, match="reconnect_timeout"):
        feed.Loader("web", socket=str(tmp_path / "none.sock"), reconnect_timeout=-1)
    d = Daemon(tmp_path, conf(), name="feedd")
    try:
        loader = feed.Loader("web", socket=d.socket, as_numpy=True, timeout=60, reconnect_timeout=1.5)
        next(loader)
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait()
        t0 = time.time()
        with pytest.raises(feed.DaemonGoneError, match="feedd stopped and did not come back within 1.5 s") as e:
            for _ in range(100):
                next(loader)
        took = time.time() - t0
        assert 1.4 < took < 10, took
        assert e.value.code == -errno.ESHUTDOWN
        with pytest.raises(feed.DaemonGoneError):  # and stays raised
            next(loader)
        loader.close()
    finally:
        d.stop()


def test_a_c_trainer_is_bounded_by_feed_reconnect_timeout_and_0_turns_it_off(tmp_path, data):
    d = Daemon(tmp_path, conf(), name="feedd")
    bounded = Drained(c_client(d.socket, "web", 0, 1, sleep_ms=1, reconnect_ms=1500, by_env=True))
    off = Drained(c_client(d.socket, "web", 0, 1, sleep_ms=1, reconnect_ms=0, by_env=True))
    try:
        assert bounded.wait_for_line("attached") and off.wait_for_line("attached")
        time.sleep(0.2)
        d.proc.kill()
        d.proc.wait()
        t0 = time.time()
        off.proc.wait(timeout=10)
        took_off = time.time() - t0
        bounded.proc.wait(timeout=30)
        took = time.time() - t0
    finally:
        for c in (bounded, off):
            if c.proc.poll() is None:
                c.proc.kill()
    assert off.proc.returncode == 1 and took_off < 2, (took_off, off.text()[-300:])
    assert "feedd closed the connection" in off.text().splitlines()[-1]
    last = bounded.text().splitlines()[-1]
    assert bounded.proc.returncode == 1 and 1.4 < took < 10, (took, last)
    assert last.startswith("error -104 ") and "did not come back within 1.5 s (reconnect_timeout)" in last, last
    assert "last attempt: cannot reach feedd at" in last, last  # what the last try met: the socket is gone


def start_on_kept_socket(tmp, lsock):
    """feedd serving a listening socket it inherits (fd 3, $LISTEN_FDS), as systemd's feedd.socket passes it."""
    c = tmp / "kept.conf"
    c.write_text(conf())
    fd = lsock.fileno()
    # The socket must end up as fd 3 of the process that execs feedd (sh cannot move an fd above 9).
    shim = ("import os, sys; fd = int(sys.argv[1])\n"
            "if fd != 3: os.dup2(fd, 3); os.close(fd)\n"
            "os.environ['LISTEN_PID'] = str(os.getpid()); os.execv(sys.argv[2], sys.argv[2:])")
    return subprocess.Popen([sys.executable, "-c", shim, str(fd), str(FEEDD), "-c", str(c)],
                            env={**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "control"}, pass_fds=(fd,),
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "kept.log", "w"))


@pytest.mark.parametrize("socket_kept", [False, True], ids=["socket gone", "socket kept"])
def test_signals_during_the_backoff_act_at_once(tmp_path, data, socket_kept):
    """SIGTERM ends a C trainer (no handler) and Ctrl-C interrupts a Python one (KeyboardInterrupt)
    while they wait for a daemon that is not there, not after reconnect_timeout (300 s by default):
    in the backoff (the socket is gone), and while connected to a socket kept by the service manager
    that no daemon serves yet (the HELLO is not answered)."""
    import socket as socketmod
    lsock = None
    if socket_kept:
        sock = str(tmp_path / "kept.sock")
        lsock = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
        lsock.bind(sock)
        lsock.listen(16)
        proc = start_on_kept_socket(tmp_path, lsock)
    else:
        d = Daemon(tmp_path, conf(), name="feedd")
        sock, proc = d.socket, d.proc
    c = Drained(c_client(sock, "web", 0, 1, sleep_ms=1))
    env = {**os.environ, "PYTHONPATH": use_feed_package(), "FEEDD_BUILD_DIR": str(STREAM_CLIENT.parents[2])}
    py = subprocess.Popen([sys.executable, "-c", """
import sys, time, feed
loader = feed.Loader("web", socket=sys.argv[1], as_numpy=True)
next(loader)
print("attached", flush=True)
try:
    while True:
        next(loader)
except KeyboardInterrupt:
    print("interrupted", loader.stats()["reconnects"], flush=True)
""", sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    py = Drained(py)
    try:
        log = tmp_path / "kept.log"
        assert c.wait_for_line("attached") and py.wait_for_line("attached"), \
            (c.err(), py.err(), log.read_text() if log.exists() else "")
        proc.kill()
        proc.wait()
        time.sleep(1.0)  # both are reconnecting now
        assert c.proc.poll() is None and py.proc.poll() is None, "a client gave up instead of reconnecting"
        t0 = time.time()
        c.proc.send_signal(signal.SIGTERM)
        py.proc.send_signal(signal.SIGINT)
        c.proc.wait(timeout=10)
        py.proc.wait(timeout=10)
        took = time.time() - t0
    finally:
        for p in (c, py):
            if p.proc.poll() is None:
                p.proc.kill()
        if lsock:
            lsock.close()
    assert c.proc.returncode == -signal.SIGTERM, c.proc.returncode
    assert "interrupted 0" in py.text() and py.proc.returncode == 0, (py.text(), py.err()[-500:])
    assert took < 3, f"the signals took {took:.1f} s"


def test_a_kept_socket_that_no_daemon_serves_is_named_after_the_timeout(tmp_path, data):
    """The service manager keeps the socket, the daemon does not come back: connecting succeeds and the
    HELLO is never answered; the trainer still gets its error at the timeout, saying what happened."""
    import socket as socketmod
    lsock = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
    sock = str(tmp_path / "kept.sock")
    lsock.bind(sock)
    lsock.listen(16)
    proc = start_on_kept_socket(tmp_path, lsock)
    c = Drained(c_client(sock, "web", 0, 1, sleep_ms=1, reconnect_ms=1500, by_env=True))
    try:
        assert c.wait_for_line("attached"), (c.err(), (tmp_path / "kept.log").read_text())
        proc.kill()
        proc.wait()
        t0 = time.time()
        c.proc.wait(timeout=30)
        took = time.time() - t0
    finally:
        if c.proc.poll() is None:
            c.proc.kill()
        lsock.close()
    last = c.text().splitlines()[-1]
    assert c.proc.returncode == 1 and 1.4 < took < 5, (took, last)
    assert "did not come back within 1.5 s (reconnect_timeout); last attempt: reading from feedd: timed out" in last, \
        last


def test_train_c_keeps_training_across_restarts(tmp_path, data):
    """examples/train_c has no code for restarts and nothing set: it just keeps training."""
    d = Daemon(tmp_path, conf(), name="feedd")
    env = {k: v for k, v in os.environ.items() if k != "FEED_RECONNECT_TIMEOUT"}
    p = subprocess.Popen([str(BUILD / "examples" / "train_c"), "--socket", d.socket, "--feed", "web", "--steps", "400",
                          "--step-ms", "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    procs = [d.proc]
    try:
        for how in (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            time.sleep(0.5)
            assert p.poll() is None, p.communicate()
            d.proc.send_signal(how)
            d.proc.wait()
            time.sleep(0.3)
            d = Daemon(tmp_path, conf(), name="feedd")
            procs.append(d.proc)
        out, err = p.communicate(timeout=120)
        reconnects = [c["reconnects"] for c in d.status()["clients"]]
    finally:
        if p.poll() is None:
            p.kill()
        d.stop()
        for q in procs:
            if q.poll() is None:
                q.kill()
    assert p.returncode == 0, (out[-500:], err[-500:])
    assert "done: 400 steps" in out and err == "", (out[-500:], err)
    assert reconnects == [], reconnects  # it detached at the end


def test_a_device_loader_attaches_again_as_one(tmp_path, data):
    """feed.Loader(device=...) across a SIGKILL and restart: the re-attach asks for device batches again
    (the new daemon's buffers are imported; here, without a GPU, both daemons answer with host batches and
    the loader falls back each time) and the stream reads on bit-identically."""
    os.environ.setdefault("FEEDD_BUILD_DIR", str(STREAM_CLIENT.parents[2]))
    use_feed_package()
    torch = pytest.importorskip("torch")
    import warnings
    import feed

    d = Daemon(tmp_path, conf(), name="feedd")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            loader = feed.Loader("web", socket=d.socket, device="cuda:0", allow_host_fallback=True, timeout=60)
        got = [next(loader)["input_ids"].clone() for _ in range(5)]
        d.proc.kill()
        d.proc.wait()
        d = Daemon(tmp_path, conf(), name="feedd")
        got += [next(loader)["input_ids"].clone() for _ in range(10)]
        assert loader.stats()["reconnects"] == 1
        st = d.status()
        mine = [c for c in st["clients"] if c["pid"] == os.getpid()]
        assert len(mine) == 1 and mine[0]["reconnects"] == 1, mine
        loader.close()
        ref = feed.Loader("web", socket=d.socket, reconnect_timeout=0)
        want = [next(ref)["input_ids"].clone() for _ in range(len(got))]
        ref.close()
        for i, (a, w) in enumerate(zip(got, want)):
            assert torch.equal(a, w), f"batch {i} differs from the undisturbed run"
    finally:
        d.stop()
