# SPDX-License-Identifier: MIT
"""Crashes on either side lose nothing.

- A client SIGKILLed at random moments, 100 times: the daemon reclaims its
  ring within a second, the other ranks' streams are bit-identical to a run
  without kills, and the killed rank, restarted each time from the cursor of
  the last batch it consumed, receives exactly the stream of an undisturbed
  run: no batch lost, none repeated.
- The daemon SIGKILLed 20 times under attached clients with libfeed's
  reconnect turned off (reconnect_timeout 0; the default reconnects, see
  test_reconnect.py): every client gets a clear error within a second (no
  hang, no crash, no SIGBUS), and after each restart on the same socket
  every rank resumes exactly from its cursor.

Clients are tests/integration/stream-client (libfeed), which prints one
flushed line per consumed batch with a hash of its arrays and its cursor.
FEEDD_TEST_TIME_SCALE (default 1) stretches the one-second promises for
runs under sanitizers or valgrind.
"""

import os
import random
import signal
import subprocess
import threading
import time

import pytest

from conftest import Daemon, feed_conf, open_fds

SCALE = float(os.environ.get("FEEDD_TEST_TIME_SCALE", "1"))
FEED_SEED = 7


def batches(text):
    """(index, hash, cursor) of every batch line a stream-client printed."""
    out = []
    for line in text.splitlines():
        if line.startswith("batch "):
            _, index, _, h, cursor = line.split()
            out.append((int(index), h, cursor))
    return out


def clean_run(d, rank, world, n):
    p = d.client("web", rank, world, n)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    got = batches(out)
    assert len(got) == n
    return got


def assert_same_stream(got, want, who):
    assert [g[0] for g in got] == list(range(len(got))), f"{who}: batch indices not contiguous from 0"
    for (i, h, _), (_, wh, _) in zip(got, want):
        assert h == wh, f"{who}: batch {i} differs from the undisturbed run"


class Drained:
    """A client whose stdout and stderr are read by threads as it runs, so a full pipe never stalls it."""

    def __init__(self, proc):
        self.proc = proc
        self.lines, self.errs = [], []
        self.threads = [threading.Thread(target=self._pump, args=(proc.stdout, self.lines), daemon=True),
                        threading.Thread(target=self._pump, args=(proc.stderr, self.errs), daemon=True)]
        for t in self.threads:
            t.start()

    @staticmethod
    def _pump(f, into):
        for line in f:
            into.append(line)

    def wait_for_line(self, text, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if any(line.strip() == text for line in self.lines):
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        return any(line.strip() == text for line in self.lines)

    def _join(self):
        for t in self.threads:
            t.join(timeout=10)

    def text(self):
        self._join()
        return "".join(self.lines)

    def err(self):
        self._join()
        return "".join(self.errs)


def client_pids(d):
    return {c["pid"] for c in d.status()["clients"]}


def test_a_client_killed_100_times_loses_nothing_and_disturbs_nobody(daemon, dataset):
    rng = random.Random(20240601)
    world = 4
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256, seed=FEED_SEED))
    base_fds = open_fds(d.proc.pid)
    # Ranks 1..3 read steadily the whole time the victim (rank 0) is being killed.
    steady_n = 400
    steady = {r: d.client("web", r, world, steady_n, sleep_ms=20) for r in range(1, world)}

    victim_stream = []
    cursor = None
    slowest_reclaim = 0.0
    for kill in range(100):
        v = d.client("web", 0, world, 1_000_000, cursor=cursor, sleep_ms=rng.choice([0, 1, 3]))
        # Random moments: before HELLO, during ATTACH, with a full ring, mid-release.
        time.sleep(rng.uniform(0.0, 0.12))
        v.send_signal(signal.SIGKILL)
        out, err = v.communicate(timeout=30)
        assert v.returncode == -signal.SIGKILL, f"kill {kill}: victim exited with {v.returncode}: {err}"
        got = batches(out)
        if got:
            expect_first = victim_stream[-1][0] + 1 if victim_stream else 0
            assert got[0][0] == expect_first, \
                f"kill {kill}: resumed at batch {got[0][0]}, expected {expect_first} (cursor {cursor})"
            victim_stream += got
            cursor = got[-1][2]
        t0 = time.time()
        while v.pid in client_pids(d):
            assert time.time() - t0 < 1.0 * SCALE, f"kill {kill}: slots of pid {v.pid} not reclaimed within a second"
            time.sleep(0.01)
        slowest_reclaim = max(slowest_reclaim, time.time() - t0)

    assert len(victim_stream) > 100, "the victim consumed too little for the test to mean anything"
    for r, p in steady.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {r}: {err}"
        assert_same_stream(batches(out), clean_run(d, r, world, steady_n), f"steady rank {r}")
    assert_same_stream(victim_stream, clean_run(d, 0, world, len(victim_stream)), "killed rank 0")
    assert d.status()["clients"] == []
    assert open_fds(d.proc.pid) == base_fds, "feedd leaked file descriptors after 100 killed clients"
    print(f"victim consumed {len(victim_stream)} batches over 100 kills; slowest reclaim {slowest_reclaim:.3f} s")


@pytest.fixture
def crashing_daemons(tmp_path):
    started = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def test_the_daemon_killed_20_times_loses_nothing(tmp_path, dataset, crashing_daemons):
    rng = random.Random(77)
    world = 3
    conf = feed_conf("web", f"{dataset}/shard_*.idx", eos=50256, seed=FEED_SEED)
    streams = {r: [] for r in range(world)}
    cursors = {r: None for r in range(world)}
    slowest = 0.0
    for kill in range(20):
        # The same socket path every time, as a service manager restarts it: a stale socket must not stop it.
        d = Daemon(tmp_path, conf, name="feedd")
        crashing_daemons.append(d)
        # reconnect_ms=0: a trainer that turned libfeed's reconnect off gets the error at once, and resumes
        # from its checkpoint (test_reconnect.py has the default, which reconnects).
        clients = {r: Drained(d.client("web", r, world, 1_000_000, cursor=cursors[r], sleep_ms=rng.choice([0, 2]),
                                       reconnect_ms=0))
                   for r in range(world)}
        for r, c in clients.items():
            assert c.wait_for_line("attached"), f"kill {kill}, rank {r}: did not attach: {c.text()} {c.err()}"
        time.sleep(rng.uniform(0.02, 0.3))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        t0 = time.time()
        for r, c in clients.items():
            try:
                c.proc.wait(timeout=max(0.0, 1.0 * SCALE - (time.time() - t0)) + 0.05)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
                raise AssertionError(f"kill {kill}: rank {r} did not notice the daemon's death within a second")
            out, err = c.text(), c.err()
            assert c.proc.returncode == 1, f"kill {kill}, rank {r}: exit status {c.proc.returncode} (signal?): {err}"
            assert "feedd closed the connection" in out or "stopped or crashed" in out, \
                f"kill {kill}, rank {r}: unclear error: {out.splitlines()[-1:]} {err}"
            got = batches(out)
            if got:
                expect_first = streams[r][-1][0] + 1 if streams[r] else 0
                assert got[0][0] == expect_first, f"kill {kill}, rank {r}: resumed at {got[0][0]}, not {expect_first}"
                streams[r] += got
                cursors[r] = got[-1][2]
        slowest = max(slowest, time.time() - t0)

    d = Daemon(tmp_path, conf, name="feedd")
    crashing_daemons.append(d)
    for r in range(world):
        assert len(streams[r]) > 20, f"rank {r} consumed too little for the test to mean anything"
        assert_same_stream(streams[r], clean_run(d, r, world, len(streams[r])), f"rank {r}")
    assert d.stop() == 0
    print(f"ranks consumed {[len(s) for s in streams.values()]} batches over 20 daemon kills; "
          f"slowest client notice {slowest:.3f} s")
