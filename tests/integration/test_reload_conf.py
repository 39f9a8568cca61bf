# SPDX-License-Identifier: MIT
"""Reload and configuration on a shared node (issue #18, findings 7 and 8).

- Nothing that touches a file system runs on feedd's main loop: loading,
  reload and --check run on a loader thread that gives up after
  load_timeout_s without progress, naming the path it is stuck on. Clients
  keep streaming while a reload works, even one stuck on a shard.
- A reload is all-or-nothing: a feed of the new config that fails to load,
  or a config with no feeds, leaves the running config serving and
  `feedctl reload` exits non-zero with the reasons.
- Configs that used to pass and should not: a batch over the ring limit, a
  NUL byte in a value, a too-long socket path, a missing tokenizer: each is
  refused with the file and line.

- The once-a-second check that shards are unchanged stat()s them on a
  thread of its own: a stat() that hangs holds up that sweep only, starts
  no second one, and is reported after load_timeout_s.

The "slow file system" is a file lease (fcntl F_SETLEASE) held by the test:
opening the leased shard blocks until the lease is given up or the kernel's
lease-break-time (45 s by default) passes, as an open on a hung network
mount would. A lease does not hold up stat(): for the periodic check an
LD_PRELOAD shim (stall-stat.c) makes stat() of one shard file sleep.
"""

import fcntl
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import BUILD, DAEMON_WRAPPER, FEEDCTL, FEEDD, feed_conf, gen_megatron, with_io_engine


def small_data(tmp, name, shards=2, seed=3):
    d = Path(tmp) / name
    d.mkdir()
    gen_megatron.main([str(d), "--shards", str(shards), "--docs-per-shard", "200", "--mean-len", "300",
                       "--seed", str(seed)])
    return d


class Timed:
    """A stream-client whose batch lines are time-stamped as they arrive."""

    def __init__(self, proc):
        self.proc = proc
        self.times = []
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("batch"):
                self.times.append(time.monotonic())
                self.lines.append(line)

    def wait_batches(self, n, timeout=30):
        deadline = time.time() + timeout
        while len(self.times) < n and time.time() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.01)
        assert len(self.times) >= n, "the client got no batches"

    def max_gap(self, t0, t1):
        ts = [t for t in self.times if t0 <= t <= t1]
        assert len(ts) >= 10, f"only {len(ts)} batches between the reload's start and end"
        return max(b - a for a, b in zip(ts, ts[1:]))

    def max_gap_until(self, t0, t1):
        """max_gap, counting too the wait from the last batch to t1 (a client that got none since)."""
        last = max((t for t in self.times if t <= t1), default=t0)
        return max(self.max_gap(t0, t1), t1 - last)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def hold_lease(path):
    """A write lease on path: another process's open() of it waits until the lease is let go."""
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # the kernel's "please give it up" must not kill the test
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError as e:
        os.close(fd)
        pytest.skip(f"cannot take a file lease on {path} ({e}): no way to make an open() hang here")
    return fd


def conf_with(body, timeout_s=None):
    head = "[feedd]\n" + (f"load_timeout_s = {timeout_s}\n" if timeout_s else "")
    return with_io_engine(head + body)


def check(conf, timeout=20):
    """feedd --check; a hang is a failure, not a stuck test."""
    try:
        return subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"feedd --check did not finish within {timeout} s")


def streaming(d, feed):
    c = Timed(d.client(feed, 0, 1, 100000, sleep_ms=10))
    c.wait_batches(20)
    return c


def reload_timed(d, timeout=60):
    t0 = time.monotonic()
    try:
        p = d.ctl("reload", check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"feedctl reload did not answer within {timeout} s")
    return p, t0, time.monotonic()


# ---- finding 7: nothing that touches a file system runs on the main loop ----

def test_reload_stuck_on_a_shard_keeps_clients_streaming_and_times_out(daemon, tmp_path):
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=5)
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good, timeout_s=3))
    c = streaming(d, "web")
    lease = hold_lease(b / "shard_000.idx")
    try:
        d.conf.write_text(conf_with(good + feed_conf("slow", f"{b}/shard_*.idx", seq_len=64, batch_size=2),
                                    timeout_s=3))
        p, t0, t1 = reload_timed(d)
        # The reload gave up after load_timeout_s, naming the shard it is stuck on, and failed.
        assert p.returncode != 0, p.stdout
        assert f"{b}/shard_000.idx: no answer for 3 s (load_timeout_s)" in p.stderr, p.stderr
        assert "running configuration stays" in p.stderr
        assert 2.5 < t1 - t0 < 30
        # Meanwhile the client streamed on: its batches never paused for long.
        gap = c.max_gap(t0, t1)
        assert gap < 1.0, f"a client waited {gap:.2f} s for a batch while the reload was stuck"
        # The old config serves on, as before.
        assert [(f["name"], f["state"], f["draining"]) for f in d.status()["feeds"]] == [("web", "ready", False)]
        # Another reload while a load is stuck on its thread is no problem either (a new thread, a new try).
        p, t0, t1 = reload_timed(d)
        assert p.returncode != 0 and "no answer for 3 s" in p.stderr
        assert c.max_gap(t0, t1) < 1.0
    finally:
        os.close(lease)
    # Once the file answers again, the same config loads.
    p, _, _ = reload_timed(d)
    assert p.returncode == 0, p.stderr
    assert sorted(f["name"] for f in d.status()["feeds"]) == ["slow", "web"]
    assert c.proc.poll() is None
    c.stop()


def fds_under(d, folder):
    """What feedd holds open under folder."""
    out = []
    for fd in os.listdir(f"/proc/{d.proc.pid}/fd"):
        try:
            t = os.readlink(f"/proc/{d.proc.pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith(str(folder) + "/"):
            out.append(t)
    return sorted(out)


def test_a_reload_refused_or_given_up_on_keeps_no_descriptor_of_its_files(daemon, tmp_path):
    """The loader readies a new feed's files for the change watch (it opens the .idx files no source holds). A
    reload refused (another of its feeds failed) or given up on (a shard's open hung) lets them go: once it is
    over, feedd holds nothing open under the new feed's folder."""
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=5)
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good, timeout_s=3))
    assert fds_under(d, b) == []
    # Refused: "new" loads (and is readied), "gone" matches nothing.
    d.conf.write_text(conf_with(good + feed_conf("new", f"{b}/shard_*.idx", seq_len=64, batch_size=2)
                                + feed_conf("gone", f"{tmp_path}/nothing/shard_*.idx", seq_len=64, batch_size=2),
                                timeout_s=3))
    p, _, _ = reload_timed(d)
    assert p.returncode != 0 and "1 of 3 feeds failed to load" in p.stderr, p.stderr
    assert fds_under(d, b) == [], "a refused reload kept descriptors of its files"
    # Given up on: the second shard's open hangs; when it answers, the load finishes on its own and lets go.
    lease = hold_lease(b / "shard_001.idx")
    try:
        d.conf.write_text(conf_with(good + feed_conf("new", f"{b}/shard_*.idx", seq_len=64, batch_size=2),
                                    timeout_s=3))
        p, _, _ = reload_timed(d)
        assert p.returncode != 0 and "no answer for 3 s" in p.stderr, p.stderr
    finally:
        os.close(lease)
    deadline = time.time() + 10
    while fds_under(d, b) and time.time() < deadline:
        time.sleep(0.1)
    assert fds_under(d, b) == [], "a reload given up on kept descriptors of its files"
    # The same config, answered: taken up and watched, through descriptors of its own.
    p, _, _ = reload_timed(d)
    assert p.returncode == 0, p.stderr
    assert fds_under(d, b), "the new feed holds its files"


def test_stopping_during_a_stuck_reload(daemon, tmp_path):
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=5)
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good, timeout_s=30))
    lease = hold_lease(b / "shard_000.idx")
    try:
        d.conf.write_text(conf_with(good + feed_conf("slow", f"{b}/shard_*.idx", seq_len=64, batch_size=2),
                                    timeout_s=30))
        p = subprocess.Popen([str(FEEDCTL), "--socket", d.socket, "reload"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 10
        while "reloading" not in d.log_text() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        # SIGTERM with the loader stuck in open(): feedd stops at once, and cleanly.
        t0 = time.monotonic()
        assert d.stop() == 0, d.log_text()
        assert time.monotonic() - t0 < 5
        p.communicate(timeout=10)
        assert p.returncode != 0
    finally:
        os.close(lease)


def test_fifo_in_a_shard_glob_is_refused_not_waited_on(daemon, tmp_path):
    a = small_data(tmp_path, "a")
    f = tmp_path / "fifo"
    f.mkdir()
    os.mkfifo(f / "x.idx")
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    bad = good + feed_conf("pipe", f"{f}/*.idx", seq_len=64, batch_size=2)

    # --check says what is wrong, at once, and fails.
    conf = tmp_path / "check.conf"
    conf.write_text(conf_with(bad))
    t0 = time.monotonic()
    p = check(conf)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{f}/x.idx: .idx and .bin must be regular files" in p.stdout + p.stderr
    assert time.monotonic() - t0 < 10

    # A reload that meets it: clients stream on, the reload fails with the reason, the old config stays.
    d = daemon(conf_with(good))
    c = streaming(d, "web")
    d.conf.write_text(conf_with(bad))
    p, t0, t1 = reload_timed(d)
    assert p.returncode != 0
    assert "feed pipe" in p.stderr and f"{f}/x.idx: .idx and .bin must be regular files" in p.stderr, p.stderr
    assert [f["name"] for f in d.status()["feeds"]] == ["web"]
    time.sleep(0.3)
    assert c.max_gap(t0 - 0.2, time.monotonic()) < 1.0
    c.stop()


STALL_SHIM = BUILD / "tests" / "integration" / "stall-stat.so"


def test_a_shard_whose_stat_hangs_stalls_no_client(daemon, tmp_path, monkeypatch):
    """The periodic shard check meets a stat() that hangs (a hung network mount): clients stream on, no second
    sweep starts while it hangs, and the log names the file it is stuck on after load_timeout_s."""
    if not STALL_SHIM.exists():
        pytest.skip(f"{STALL_SHIM} is not built")
    if DAEMON_WRAPPER or "libasan" in subprocess.run(["ldd", str(FEEDD)], capture_output=True, text=True).stdout:
        pytest.skip("the stat() shim is preloaded into feedd, which a wrapper or a sanitizer runtime forbids")
    a = small_data(tmp_path, "a")
    hung = os.path.realpath(a / "shard_000.bin")
    trigger, stalls = tmp_path / "mount-hangs", tmp_path / "stalls"
    for k, v in {"LD_PRELOAD": str(STALL_SHIM), "STALL_PATH": hung, "STALL_TRIGGER": str(trigger),
                 "STALL_LOG": str(stalls), "STALL_S": "8"}.items():
        monkeypatch.setenv(k, v)
    d = daemon(conf_with(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2), timeout_s=2))
    monkeypatch.delenv("LD_PRELOAD")  # the clients and feedctl stat as they like
    c = streaming(d, "web")
    trigger.touch()
    t0 = time.monotonic()
    deadline = time.time() + 10
    while not stalls.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert stalls.exists(), "the periodic check never stat'd " + hung
    time.sleep(4.5)  # well past load_timeout_s (2 s), still inside the 8 s stall
    t1 = time.monotonic()
    gap = c.max_gap_until(t0, t1)
    assert gap < 1.0, f"a client waited {gap:.2f} s for a batch while a shard's stat() hung"
    # One sweep hangs, off the main thread; none started beside it.
    assert stalls.read_text() == "stall thread\n", stalls.read_text()
    assert f"shard check stuck on {hung} for " in d.log_text(), d.log_text()
    assert [(f["name"], f["state"]) for f in d.status()["feeds"]] == [("web", "ready")]
    # The mount answers again: checks go on, the feed stays ready, and the client streamed throughout.
    trigger.unlink()
    time.sleep(5)
    assert "the shard check stuck before has answered" in d.log_text(), d.log_text()
    assert [(f["name"], f["state"]) for f in d.status()["feeds"]] == [("web", "ready")]
    assert c.proc.poll() is None
    assert c.max_gap_until(t0, time.monotonic()) < 1.0
    c.stop()


def test_a_short_read_whose_recheck_hangs_stalls_no_client(daemon, tmp_path, monkeypatch):
    """A read that comes up short (a shard cut while served) has its whole feed checked at once; that check
    stat()s the feed's other shard, whose mount hangs: the check waits on the checker's thread, never on the
    main loop, so a client of another feed streams on; the feed fails when the check answers."""
    if not STALL_SHIM.exists():
        pytest.skip(f"{STALL_SHIM} is not built")
    if DAEMON_WRAPPER or "libasan" in subprocess.run(["ldd", str(FEEDD)], capture_output=True, text=True).stdout:
        pytest.skip("the stat() shim is preloaded into feedd, which a wrapper or a sanitizer runtime forbids")
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=4)
    hung = os.path.realpath(a / "shard_000.bin")
    trigger, stalls = tmp_path / "mount-hangs", tmp_path / "stalls"
    for k, v in {"LD_PRELOAD": str(STALL_SHIM), "STALL_PATH": hung, "STALL_TRIGGER": str(trigger),
                 "STALL_LOG": str(stalls), "STALL_S": "6"}.items():
        monkeypatch.setenv(k, v)
    # No lease or inotify watch: the cut is found by the reads, the path under test.
    d = daemon(with_io_engine("[feedd]\nwatch_changes = off\nload_timeout_s = 30\n"
                              + feed_conf("a", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
                              + feed_conf("b", f"{b}/shard_*.idx", seq_len=64, batch_size=2)))
    monkeypatch.delenv("LD_PRELOAD")
    other = streaming(d, "b")
    cut = Timed(d.client("a", 0, 1, 100000, sleep_ms=10))
    cut.wait_batches(5)
    trigger.touch()
    deadline = time.time() + 10
    while not stalls.exists() and time.time() < deadline:  # the periodic sweep now hangs on shard_000
        time.sleep(0.05)
    assert stalls.exists(), "the periodic check never stat'd " + hung
    t0 = time.monotonic()
    with open(a / "shard_001.bin", "r+b") as f:
        f.truncate(100)
    cut.proc.wait(timeout=5)  # its session stops at the short read, without waiting for any stat()
    assert cut.proc.returncode == 1 and "changed while serving" in cut.proc.stderr.read()
    time.sleep(2)
    gap = other.max_gap_until(t0, time.monotonic())
    assert gap < 1.0, f"a client of another feed waited {gap:.2f} s for a batch while a re-check's stat() hung"
    assert "main" not in stalls.read_text(), stalls.read_text()
    trigger.unlink()
    deadline = time.time() + 15
    while time.time() < deadline and d.status()["feeds"][0]["state"] != "failed":
        time.sleep(0.1)
    assert [(f["name"], f["state"]) for f in d.status()["feeds"]] == [("a", "failed"), ("b", "ready")]
    assert other.proc.poll() is None
    other.stop()


def test_a_reload_whose_new_shard_hangs_after_its_load_stalls_no_client(daemon, tmp_path, monkeypatch):
    """The change watch readies a new feed's files (the stat(), the open() for its lease) on the loader thread,
    after the load: a shard whose mount hangs for the main thread once the load is done with it (the shim stalls
    only the main thread's stat() and open() of it) holds up no client, and the reload succeeds; the main loop
    only takes the lease with fcntl() on the descriptor the loader opened, or watches /proc/self/fd/N. On the
    tree before, the main loop stat()ed it while taking the feed up and every client waited 8 s."""
    if not STALL_SHIM.exists():
        pytest.skip(f"{STALL_SHIM} is not built")
    if DAEMON_WRAPPER or "libasan" in subprocess.run(["ldd", str(FEEDD)], capture_output=True, text=True).stdout:
        pytest.skip("the stat() shim is preloaded into feedd, which a wrapper or a sanitizer runtime forbids")
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=5)
    hung = os.path.realpath(b / "shard_000.idx")
    trigger, stalls = tmp_path / "mount-hangs", tmp_path / "stalls"
    for k, v in {"LD_PRELOAD": str(STALL_SHIM), "STALL_PATH": hung, "STALL_TRIGGER": str(trigger),
                 "STALL_LOG": str(stalls), "STALL_S": "8", "STALL_ONLY": "main"}.items():
        monkeypatch.setenv(k, v)
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good, timeout_s=30))
    monkeypatch.delenv("LD_PRELOAD")
    c = streaming(d, "web")
    trigger.touch()
    d.conf.write_text(conf_with(good + feed_conf("new", f"{b}/shard_*.idx", seq_len=64, batch_size=2),
                                timeout_s=30))
    p, t0, _ = reload_timed(d)
    time.sleep(1.5)
    t1 = time.monotonic()
    gap = c.max_gap_until(t0, t1)
    stalled = stalls.read_text() if stalls.exists() else ""
    assert gap < 1.0, f"a client waited {gap:.2f} s for a batch while the reload took up a hung shard ({stalled!r})"
    assert "main" not in stalled, stalled
    assert p.returncode == 0, p.stderr
    assert sorted((f["name"], f["state"]) for f in d.status()["feeds"]) == [("new", "ready"), ("web", "ready")]
    # Watched all the same, through the descriptors the loader opened.
    m = re.search(r"feed new: (\d+) files watched for changes, (\d+) under read leases, (\d+) with inotify, "
                  r"(\d+) not watched", d.log_text())
    assert m and int(m[1]) == 4 and int(m[4]) == 0, d.log_text()
    trigger.unlink()
    with open(b / "shard_001.bin", "r+b") as f:  # a writer: the watch fails the feed before its first byte
        f.write(f.read(1))
    deadline = time.time() + 10
    while time.time() < deadline and dict((f["name"], f["state"]) for f in d.status()["feeds"])["new"] != "failed":
        time.sleep(0.05)
    assert dict((f["name"], f["state"]) for f in d.status()["feeds"]) == {"new": "failed", "web": "ready"}
    assert c.proc.poll() is None
    c.stop()


def test_stopping_while_a_shard_check_hangs(daemon, tmp_path, monkeypatch):
    if not STALL_SHIM.exists():
        pytest.skip(f"{STALL_SHIM} is not built")
    if DAEMON_WRAPPER or "libasan" in subprocess.run(["ldd", str(FEEDD)], capture_output=True, text=True).stdout:
        pytest.skip("the stat() shim is preloaded into feedd, which a wrapper or a sanitizer runtime forbids")
    a = small_data(tmp_path, "a")
    trigger, stalls = tmp_path / "mount-hangs", tmp_path / "stalls"
    for k, v in {"LD_PRELOAD": str(STALL_SHIM), "STALL_PATH": os.path.realpath(a / "shard_001.idx"),
                 "STALL_TRIGGER": str(trigger), "STALL_LOG": str(stalls), "STALL_S": "30"}.items():
        monkeypatch.setenv(k, v)
    d = daemon(conf_with(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2), timeout_s=2))
    monkeypatch.delenv("LD_PRELOAD")
    c = streaming(d, "web")
    trigger.touch()
    deadline = time.time() + 10
    while not stalls.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert stalls.exists()
    time.sleep(0.5)
    # SIGTERM with the checker's thread asleep in stat(): feedd stops at once, and cleanly.
    t0 = time.monotonic()
    assert d.stop() == 0, d.log_text()
    assert time.monotonic() - t0 < 5
    c.stop()


def test_check_gives_up_on_a_stuck_load(tmp_path):
    a = small_data(tmp_path, "a")
    conf = tmp_path / "feedd.conf"
    conf.write_text(conf_with(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2), timeout_s=2))
    lease = hold_lease(a / "shard_001.idx")
    try:
        t0 = time.monotonic()
        p = check(conf, timeout=20)
        took = time.monotonic() - t0
    finally:
        os.close(lease)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"{a}/shard_001.idx: no answer for 2 s (load_timeout_s)" in p.stderr, p.stderr
    assert took < 15


def test_config_file_that_is_a_fifo_is_refused(tmp_path):
    conf = tmp_path / "feedd.conf"
    os.mkfifo(conf)
    p = check(conf)
    assert p.returncode == 1 and f"{conf}: not a regular file" in p.stderr, p.stderr


# ---- finding 8: configs that pass and should not; a reload is all-or-nothing ----

def test_batch_over_the_ring_limit_is_refused_with_its_line(daemon, tmp_path):
    a = small_data(tmp_path, "a")
    text = conf_with(feed_conf("big", f"{a}/shard_*.idx", seq_len=16385, batch_size=16384))
    conf = tmp_path / "big.conf"
    conf.write_text(text)
    line = text.splitlines().index("batch_size = 16384") + 1
    p = check(conf)
    assert p.returncode == 1
    assert f"{conf}:{line}: [feed.big]: batch_size x seq_len = 16384 x 16385" in p.stderr, p.stderr
    assert "a ring slot holds at most 4294967295 bytes" in p.stderr

    # A reload to it is refused; the healthy feed of the same name serves on.
    good = feed_conf("big", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good))
    fp = d.status()["feeds"][0]["fingerprint"]
    d.conf.write_text(text)
    p = d.ctl("reload", check=False)
    assert p.returncode != 0 and "ring slot holds at most" in p.stderr
    st = d.status()["feeds"]
    assert [(f["name"], f["state"], f["fingerprint"]) for f in st] == [("big", "ready", fp)]
    d.dump("big", tmp_path / "out", batches=2)


def test_reload_is_all_or_nothing(daemon, tmp_path):
    a, b = small_data(tmp_path, "a"), small_data(tmp_path, "b", seed=5)
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2) + \
        feed_conf("code", f"{b}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(conf_with(good))
    before = {f["name"]: f["fingerprint"] for f in d.status()["feeds"]}
    c = streaming(d, "code")

    def refused(text, *why):
        d.conf.write_text(text)
        p = d.ctl("reload", check=False)
        assert p.returncode != 0, f"reload accepted:\n{text}"
        assert "running configuration stays" in p.stderr
        for w in why:
            assert w in p.stderr, p.stderr
        st = d.status()["feeds"]
        assert {f["name"]: f["fingerprint"] for f in st} == before
        assert all(f["state"] == "ready" and not f["draining"] for f in st)

    # A glob that (briefly) matches nothing: the healthy feed is not replaced by a failed one.
    refused(conf_with(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2) +
                      feed_conf("code", f"{b}/nothing_*.idx", seq_len=128, batch_size=2)),
            "feed code", "matches no file")
    # One new feed that fails fails the whole reload: the others are not applied either.
    refused(conf_with(good + feed_conf("new", f"{tmp_path}/none/*.idx", seq_len=64, batch_size=2)),
            "1 of 3 feeds failed", "feed new")
    # An empty config, and one cut short before its first feed, would drain every feed.
    refused("", "holds no feeds")
    refused("[feedd]\nlog_level = info\n", "holds no feeds")
    assert c.proc.poll() is None

    # A good reload still applies.
    d.conf.write_text(conf_with(good + feed_conf("new", f"{a}/shard_*.idx", seq_len=32, batch_size=2)))
    p = d.ctl("reload")
    assert "1 added" in p.stdout
    c.stop()


def test_nul_byte_in_a_value_is_an_error(tmp_path):
    a = small_data(tmp_path, "a")
    text = conf_with(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2))
    text = text.replace("seq_len = 64", "seq_len = 64\0 junk")
    conf = tmp_path / "feedd.conf"
    conf.write_text(text)
    line = text.splitlines().index("seq_len = 64\0 junk") + 1
    p = check(conf)
    assert p.returncode == 1
    assert f"{conf}:{line}: the line holds a NUL byte" in p.stderr, p.stderr


def test_too_long_socket_path_names_file_and_line(tmp_path):
    conf = tmp_path / "feedd.conf"
    conf.write_text("[feedd]\nlog_level = info\nsocket = /run/" + "x" * 150 + "/feedd.sock\n")
    for args in (["--check"], []):
        p = subprocess.run([str(FEEDD), "-c", str(conf), *args], capture_output=True, text=True, timeout=20)
        assert p.returncode == 1
        assert f"{conf}:3: socket:" in p.stderr and "a unix socket path holds at most 107" in p.stderr, p.stderr


def test_missing_tokenizer_names_the_key(tmp_path):
    shard = tmp_path / "docs.jsonl"
    shard.write_text('{"text": "hello"}\n')
    conf = tmp_path / "feedd.conf"
    text = conf_with(f"[feed.t]\nformat = jsonl\nshards = {shard}\ntokenizer = {tmp_path}/nope/tokenizer.json\n"
                     "seq_len = 16\nbatch_size = 1\n")
    conf.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("tokenizer"))
    p = check(conf)
    out = p.stdout + p.stderr
    assert p.returncode == 1
    assert f"{conf}:{line}: tokenizer: {tmp_path}/nope/tokenizer.json: cannot open: No such file or directory" in out, out
    assert ":-1:-1:" not in out
