# SPDX-License-Identifier: MIT
"""The daemon's lifecycle with a real service-manager protocol: socket
activation by systemd-socket-activate, sd_notify datagrams received on a
NOTIFY_SOCKET of the test's own (READY, STATUS, WATCHDOG, RELOADING,
STOPPING), reloads with good and broken configs, operator commands
(feedctl reload / drain) and who may send them, SIGTERM with attached
clients, the socket's own safety (symlinks, mode, group), and journal
entries with structured fields (FEEDD_FEED=, FEEDD_RANK=, FEEDD_CLIENT_PID=).

Runs with Debian's /usr/bin/python3; see conftest.py.
"""

import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BUILD, FEEDCTL, FEEDD, STREAM_CLIENT, feed_conf, gen_megatron, open_fds, socket_answers

HAVE_SYSTEMD = "#define HAVE_SYSTEMD 1" in (BUILD / "config.h").read_text()
ACTIVATE = shutil.which("systemd-socket-activate")
needs_notify = pytest.mark.skipif(not HAVE_SYSTEMD, reason="feedd was built without libsystemd (-Dsystemd=disabled)")
needs_activate = pytest.mark.skipif(not ACTIVATE, reason="systemd-socket-activate is not installed (package systemd)")


class Notify:
    """A NOTIFY_SOCKET: the datagrams feedd sends, parsed into dicts, in order."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages = []

    def _read(self, timeout):
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536).decode()
        except (socket.timeout, BlockingIOError):
            return False
        self.messages.append(dict(line.split("=", 1) for line in data.split("\n") if line))
        return True

    def wait(self, pred, timeout=10, what="a notification"):
        """The first message (seen before or arriving now) for which pred holds; consumed with those before it."""
        deadline = time.time() + timeout
        while True:
            for i, m in enumerate(self.messages):
                if pred(m):
                    del self.messages[:i + 1]
                    return m
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"no {what} within {timeout} s; got {self.messages}")
            self._read(left)

    def drain(self, settle=0.2):
        while self._read(settle):
            pass
        out, self.messages = self.messages, []
        return out

    def close(self):
        self.sock.close()


def small_data(tmp, name="data", shards=2, seed=3):
    d = Path(tmp) / name
    d.mkdir()
    gen_megatron.main([str(d), "--shards", str(shards), "--docs-per-shard", "200", "--mean-len", "300",
                       "--seed", str(seed)])
    return d


class Activated:
    """feedd started by systemd-socket-activate on its first connection, with the test's NOTIFY_SOCKET."""

    def __init__(self, tmp, conf_text, env=()):
        self.tmp = Path(tmp)
        self.conf = self.tmp / "feedd.conf"
        self.conf.write_text(conf_text)
        # Under a directory other users may traverse (pytest's tmp is 0700), for the tests that run feedctl as nobody.
        self.sockdir = tempfile.mkdtemp(prefix="feedd-lc-")
        os.chmod(self.sockdir, 0o755)
        self.socket = os.path.join(self.sockdir, "activated.sock")
        self.log = self.tmp / "activated.log"
        self.notify = Notify(self.tmp / "notify")
        args = [ACTIVATE, "-l", self.socket, "-E", f"NOTIFY_SOCKET={self.notify.path}"]
        for e in env:
            args += ["-E", e]
        args += [str(FEEDD), "-c", str(self.conf)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        deadline = time.time() + 10
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.time() < deadline, "systemd-socket-activate did not listen"
            time.sleep(0.02)

    def ctl(self, *args, check=True, user=None):
        cmd = [str(FEEDCTL), "--socket", self.socket, *args]
        if user:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"feedctl {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def status(self):
        import json
        return json.loads(self.ctl("status", "--json").stdout)

    def client(self, feed, rank=0, world=1, batches=10**6, sleep_ms=0, hold=False):
        return subprocess.Popen([str(STREAM_CLIENT), self.socket, feed, str(rank), str(world), str(batches), "-",
                                 str(sleep_ms), "1" if hold else "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("feedd did not stop on SIGTERM within 10 s")
        self.notify.close()
        shutil.rmtree(self.sockdir, ignore_errors=True)
        return self.proc.returncode


@pytest.fixture
def activated(tmp_path):
    started = []

    def start(conf_text, **kw):
        d = Activated(tmp_path, conf_text, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        rc = d.stop()
        assert rc == 0, f"feedd exited with {rc} on SIGTERM:\n{d.log.read_text()}"


def wait_line(proc, prefix, timeout=30):
    """Reads the client's stdout until a line starting with prefix; returns it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"client ended before '{prefix}': {proc.stderr.read()}")
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no '{prefix}' from the client within {timeout} s")


@needs_activate
@needs_notify
def test_socket_activation_ready_status_watchdog_stopping(activated, tmp_path):
    data = small_data(tmp_path)
    d = activated(feed_conf("web", f"{data}/shard_*.idx", seq_len=64, batch_size=2),
                  env=["WATCHDOG_USEC=300000"])
    # Nothing runs until the first connection: the socket is the activator's.
    time.sleep(0.3)
    assert d.notify.drain() == []
    st = d.status()  # this connection starts feedd, which must answer it on the passed socket
    assert st["daemon"]["socket"] == d.socket
    pid = st["daemon"]["pid"]
    assert pid == d.proc.pid, "socket-activate execs feedd in place"
    ready = d.notify.wait(lambda m: m.get("READY") == "1", what="READY=1")
    assert ready["STATUS"].startswith("1 feeds (0 failed, 0 draining), 0 clients")
    assert "passed by the service manager" in d.log.read_text()

    # The watchdog is pinged at half of WATCHDOG_USEC while the loop runs.
    t0 = time.time()
    for _ in range(4):
        d.notify.wait(lambda m: m.get("WATCHDOG") == "1", timeout=2, what="WATCHDOG=1")
    assert time.time() - t0 < 2.5

    # STATUS= follows the clients.
    c = d.client("web", sleep_ms=5)
    wait_line(c, "batch")
    st_msg = d.notify.wait(lambda m: "STATUS" in m and "1 clients" in m["STATUS"], what="STATUS with the client")
    assert re.search(r"worst stall [0-9.]+% \(web rank 0/1\)", st_msg["STATUS"]), st_msg
    c.kill()
    c.wait()
    d.notify.wait(lambda m: "STATUS" in m and "0 clients" in m["STATUS"], what="STATUS after the client left")

    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0
    d.notify.wait(lambda m: m.get("STOPPING") == "1", what="STOPPING=1")
    # The socket belongs to the activator: feedd must not remove it.
    assert os.path.exists(d.socket)


@needs_activate
@needs_notify
def test_reload_adds_drains_and_keeps_streams(activated, tmp_path):
    a, b = small_data(tmp_path, "a", seed=1), small_data(tmp_path, "b", seed=2)
    conf_a = feed_conf("keep", f"{a}/shard_*.idx", seq_len=64, batch_size=2) + \
        feed_conf("gone", f"{a}/shard_*.idx", seq_len=32, batch_size=2)
    d = activated(conf_a)
    st = d.status()
    d.notify.wait(lambda m: m.get("READY") == "1", what="READY=1")
    keep_fp = {f["name"]: f["fingerprint"] for f in st["feeds"]}["keep"]

    # Reference: what rank 0 of 'gone' receives from a fresh attach, uninterrupted.
    ref = d.client("gone", batches=60)
    ref_lines = [l for l in ref.communicate(timeout=60)[0].splitlines() if l.startswith("batch")]
    assert len(ref_lines) == 60

    # Clients on both feeds stream while the config changes under them.
    on_gone = d.client("gone", batches=60, sleep_ms=20)
    on_keep = d.client("keep", batches=60, sleep_ms=20)
    first = wait_line(on_gone, "batch")
    wait_line(on_keep, "batch")

    d.conf.write_text(feed_conf("keep", f"{a}/shard_*.idx", seq_len=64, batch_size=2) +
                      feed_conf("new", f"{b}/shard_*.idx", seq_len=64, batch_size=2))
    before = time.monotonic()
    d.proc.send_signal(signal.SIGHUP)
    rl = d.notify.wait(lambda m: m.get("RELOADING") == "1", what="RELOADING=1")
    after = time.monotonic()
    # MONOTONIC_USEC is CLOCK_MONOTONIC in microseconds, taken when the reload began.
    assert before * 1e6 - 1e5 <= int(rl["MONOTONIC_USEC"]) <= after * 1e6 + 1e5
    d.notify.wait(lambda m: m.get("READY") == "1", what="READY=1 after the reload")

    st = d.status()
    feeds = {(f["name"], f["draining"]): f for f in st["feeds"]}
    assert ("new", False) in feeds and feeds[("new", False)]["state"] == "ready"
    assert ("gone", True) in feeds, "a removed feed with clients drains"
    assert feeds[("keep", False)]["fingerprint"] == keep_fp
    log = d.log.read_text()
    assert "reloaded" in log and "1 unchanged, 1 added, 0 replaced; 1 draining" in log

    # No new attaches to the drained feed; the new one serves.
    p = d.ctl("dump", "gone", "--batches", "1", "--out", str(tmp_path / "x"), check=False)
    assert p.returncode == 1 and "draining" in p.stderr
    d.ctl("dump", "new", "--batches", "2", "--out", str(tmp_path / "y"))

    # The attached clients finish their streams, byte for byte what they would have got.
    out, _ = on_gone.communicate(timeout=60)
    assert on_gone.returncode == 0
    assert [l for l in (first + out).splitlines() if l.startswith("batch")] == ref_lines
    on_keep.communicate(timeout=60)
    assert on_keep.returncode == 0

    # The drained feed is let go once its last client is gone.
    deadline = time.time() + 5
    while time.time() < deadline and any(f["name"] == "gone" for f in d.status()["feeds"]):
        time.sleep(0.2)
    assert not any(f["name"] == "gone" for f in d.status()["feeds"])


@needs_activate
@needs_notify
def test_broken_config_is_rejected_whole_and_the_old_one_stays(activated, tmp_path):
    a = small_data(tmp_path, "a")
    good = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = activated(good)
    before = d.status()
    d.notify.wait(lambda m: m.get("READY") == "1", what="READY=1")
    c = d.client("web", sleep_ms=10)
    wait_line(c, "batch")

    # Line 3 of [feed.other] is fine, line 9 is not: nothing of this file may apply.
    d.conf.write_text(good + "[feed.other]\nshards = /nonexistent/*.idx\nseq_len = 0\n")
    bad_line = (good + "[feed.other]\nshards = /nonexistent/*.idx\nseq_len = 0\n").splitlines().index("seq_len = 0") + 1
    d.proc.send_signal(signal.SIGHUP)
    d.notify.wait(lambda m: m.get("RELOADING") == "1", what="RELOADING=1")
    d.notify.wait(lambda m: m.get("READY") == "1", what="READY=1 after the rejected reload")
    assert f"{d.conf}:{bad_line}: seq_len: '0' is not an integer" in d.log.read_text()
    after = d.status()
    assert [f["name"] for f in after["feeds"]] == [f["name"] for f in before["feeds"]] == ["web"]
    assert not after["feeds"][0]["draining"]

    # The operator command says the same, and fails.
    p = d.ctl("reload", check=False)
    assert p.returncode == 1
    assert f"{d.conf}:{bad_line}: seq_len" in p.stderr and "running configuration stays" in p.stderr

    # The client never noticed.
    assert c.poll() is None
    wait_line(c, "batch")
    c.kill()
    c.wait()


@needs_activate
def test_feedctl_reload_and_drain_are_for_privileged_peers(activated, tmp_path):
    a = small_data(tmp_path, "a")
    nobody = pwd.getpwnam("nobody").pw_uid
    conf = "[feedd]\nsocket_mode = 0666\n" + feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2) + \
        feed_conf("code", f"{a}/shard_*.idx", seq_len=32, batch_size=2)
    d = activated(conf)
    d.status()
    os.chmod(d.socket, 0o666)  # the activator made it; feedd's socket_mode applies to sockets it binds itself

    if os.geteuid() == 0:
        p = d.ctl("drain", "web", check=False, user=nobody)
        assert p.returncode == 1 and "not allowed for uid" in p.stderr, p.stderr
        p = d.ctl("reload", check=False, user=nobody)
        assert p.returncode == 1 and "admin_users" in p.stderr
        assert d.status()["daemon"]["refused"]["admin"] == 2
        assert "reload refused" in d.log.read_text() or "drain refused" in d.log.read_text()

    c = d.client("web", batches=30, sleep_ms=20)
    wait_line(c, "batch")
    p = d.ctl("drain", "web")
    assert "feed web drained" in p.stdout
    st = d.status()
    assert {f["name"]: f["draining"] for f in st["feeds"]} == {"web": True, "code": False}
    p = d.ctl("dump", "web", "--batches", "1", "--out", str(tmp_path / "x"), check=False)
    assert p.returncode == 1 and "draining" in p.stderr
    d.ctl("dump", "code", "--batches", "1", "--out", str(tmp_path / "y"))
    # In flight finishes.
    c.communicate(timeout=60)
    assert c.returncode == 0
    p = d.ctl("drain", "nosuch", check=False)
    assert p.returncode == 1 and "no feed named 'nosuch'" in p.stderr

    # A reload brings the drained feed back: the config is the truth.
    p = d.ctl("reload")
    assert "reloaded" in p.stdout
    st = d.status()
    assert sorted((f["name"], f["draining"]) for f in st["feeds"]) == [("code", False), ("web", False)]

    if os.geteuid() == 0:
        # admin_users lets nobody do it too.
        d.conf.write_text("[feedd]\nadmin_users = nobody\n" + conf.split("\n", 2)[2])
        d.ctl("reload")
        p = d.ctl("drain", "code", user=nobody)
        assert "feed code drained" in p.stdout


def test_sigterm_tells_attached_clients_and_exits_0(daemon, tmp_path):
    a = small_data(tmp_path, "a")
    d = daemon(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2))
    waiting = d.client("web", 0, 2, 10**6, sleep_ms=0, hold=True)   # holds its ring full, then sleeps
    # reconnect_ms=0: libfeed's reconnect off, so the daemon's own words reach the trainer (test_reconnect.py
    # has the default, which waits for the next daemon).
    streaming = d.client("web", 1, 2, 10**6, sleep_ms=5, reconnect_ms=0)  # blocked in next() or busy
    wait_line(waiting, "holding")
    wait_line(streaming, "batch")
    t0 = time.time()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0
    out, err = streaming.communicate(timeout=10)
    assert time.time() - t0 < 5
    assert streaming.returncode == 1
    assert "error -108 feedd is stopping" in out, (out[-500:], err)  # -ESHUTDOWN, the daemon's own words
    waiting.kill()
    waiting.wait()
    assert not os.path.exists(d.socket), "feedd removes the socket it bound"
    assert "received SIGTERM, stopping" in d.log_text() and "stopped" in d.log_text()


def test_sigterm_while_loading_or_just_after_listening_exits_0(tmp_path):
    """SIGTERM before the loop runs: while the feeds load (an open() held by a file lease) and as soon as the
    socket answers (it listens before the loop starts). Both stop cleanly: exit 0, "stopped", the socket removed;
    before the fix the signal's default action killed feedd (-15), which CI saw as a flake."""
    from test_reload_conf import hold_lease
    a = small_data(tmp_path, "a")
    conf = tmp_path / "f.conf"
    conf.write_text(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2))
    sock = str(tmp_path / "feedd.sock")

    lease = hold_lease(a / "shard_000.idx")
    try:
        log = tmp_path / "loading.log"
        p = subprocess.Popen([str(FEEDD), "-c", str(conf), "-s", sock], stderr=open(log, "w"))
        time.sleep(1.0)
        assert p.poll() is None, log.read_text()
        assert not os.path.exists(sock), "the load was to hang on the leased shard"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0, log.read_text()
        assert "received SIGTERM, stopping" in log.read_text()
    finally:
        os.close(lease)

    for i in range(5):
        log = tmp_path / f"early{i}.log"
        p = subprocess.Popen([str(FEEDD), "-c", str(conf), "-s", sock], stderr=open(log, "w"))
        deadline = time.monotonic() + 20
        while not socket_answers(sock):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0, log.read_text()
        assert "stopped" in log.read_text()
        assert not os.path.exists(sock), "feedd removes the socket it bound"


def test_refuses_to_bind_through_a_symlink(tmp_path):
    a = small_data(tmp_path, "a")
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    link = tmp_path / "feedd.sock"
    link.symlink_to(target)
    conf = tmp_path / "f.conf"
    conf.write_text(feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2))
    p = subprocess.run([str(FEEDD), "-c", str(conf), "-s", str(link)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert f"{link} is a symbolic link; refusing to bind through it" in p.stderr
    assert target.read_text() == "precious" and link.is_symlink()


def test_socket_mode_and_group_come_from_the_config(daemon, tmp_path):
    a = small_data(tmp_path, "a")
    group = grp.getgrnam("nogroup") if "nogroup" in {g.gr_name for g in grp.getgrall()} else grp.getgrgid(os.getgid())
    d = daemon(f"[feedd]\nsocket_mode = 0640\nsocket_group = {group.gr_name}\n" +
               feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2))
    st = os.stat(d.socket)
    assert st.st_mode & 0o777 == 0o640
    if os.geteuid() == 0:
        assert st.st_gid == group.gr_gid


@pytest.mark.parametrize("line,message", [
    ("socket_mode = 0999", "socket_mode: '0999' is not an octal mode in 0..0777"),
    ("socket_group = no-such-group-here", "socket_group: 'no-such-group-here' is neither a group name"),
    ("allow_users = root, no-such-user-here", "allow_users: 'no-such-user-here' is neither a user name"),
    ("max_connections = 0", "max_connections: '0' is not an integer in 1..65536"),
    ("client_memory_max = 12Q", "client_memory_max: '12Q' is not a size in bytes"),
    ("stuck_client_s = -1", "stuck_client_s: '-1' is not an integer in 0..86400"),
])
def test_bad_lifecycle_keys_name_file_and_line(tmp_path, line, message):
    conf = tmp_path / "f.conf"
    conf.write_text(f"[feedd]\nthreads = 1\n{line}\n")
    p = subprocess.run([str(FEEDD), "-c", str(conf), "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert f"{conf}:3: {message}" in p.stderr, p.stderr


def test_no_fds_leak_across_reloads(daemon, tmp_path):
    a = small_data(tmp_path, "a")
    text = feed_conf("web", f"{a}/shard_*.idx", seq_len=64, batch_size=2)
    d = daemon(text)
    def fd_kinds():
        # Which files, not which numbers: a reloaded feed reopens its shards under new numbers.
        fds = open_fds(d.proc.pid)
        return sorted(re.sub(r"\[\d+\]", "", os.readlink(f"/proc/{d.proc.pid}/fd/{fd}")) for fd in fds)

    base = fd_kinds()
    for i in range(3):
        d.conf.write_text(text.replace("seed = 7", f"seed = {i + 10}"))  # a new fingerprint every time
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while d.log_text().count("reloaded") < i + 1:
            assert time.time() < deadline, d.log_text()
            time.sleep(0.05)
        d.ctl("dump", "web", "--batches", "2", "--out", str(tmp_path / f"o{i}"))
    assert fd_kinds() == base


def parse_journal_datagram(data):
    """The journal's native protocol: KEY=VALUE lines, or KEY, a little-endian u64 size, the value and a newline."""
    fields, pos = {}, 0
    while pos < len(data):
        nl = data.index(b"\n", pos)
        line = data[pos:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            pos = nl + 1
        else:
            k = line
            size = int.from_bytes(data[nl + 1:nl + 9], "little")
            v = data[nl + 9:nl + 9 + size]
            assert data[nl + 9 + size:nl + 10 + size] == b"\n", "a binary field not ended by a newline"
            pos = nl + 10 + size
        assert re.fullmatch(rb"[A-Z0-9][A-Z0-9_]*", k), f"{k!r} is not a journal field name"
        fields[k.decode()] = v.decode()
    return fields


def can_private_mount():
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@needs_notify
def test_journal_entries_carry_feed_rank_and_client_fields(tmp_path):
    """With stderr connected to the journal ($JOURNAL_STREAM), feedd logs through libsystemd's
    sd_journal_sendv to /run/systemd/journal/socket. The test runs feedd in a private mount namespace where
    /run is a directory of its own, so that socket is the test's: the datagrams are libsystemd's real ones."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not can_private_mount():
        pytest.skip("needs root and unshare --mount (a private mount namespace) to give feedd a journal socket")
    run = tmp_path / "run"
    (run / "systemd" / "journal").mkdir(parents=True)
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(str(run / "systemd" / "journal" / "socket"))
    journal.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    data = small_data(tmp_path)
    conf = tmp_path / "feedd.conf"
    conf.write_text(feed_conf("web", f"{data}/shard_*.idx", seq_len=64, batch_size=2))
    sock = str(tmp_path / "j.sock")
    stderr = open(tmp_path / "stderr", "w")
    st = os.fstat(stderr.fileno())
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /run && exec "$@"',
         str(run), str(FEEDD), "-c", str(conf), "-s", sock],
        stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    entries = []

    def read_until(pred, what, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in entries:
                if pred(e):
                    return e
            journal.settimeout(max(0.01, deadline - time.time()))
            try:
                entries.append(parse_journal_datagram(journal.recv(1 << 20)))
            except socket.timeout:
                pass
            assert proc.poll() is None, f"feedd exited: {(tmp_path / 'stderr').read_text()}"
        raise AssertionError(f"no journal entry {what} within {timeout} s; got {entries}")

    try:
        read_until(lambda e: "ready" in e.get("MESSAGE", ""), "saying feedd is ready")
        client = subprocess.Popen([str(STREAM_CLIENT), sock, "web", "2", "3", "5", "-", "0", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        attached = read_until(lambda e: "attached to feed web" in e.get("MESSAGE", ""), "about the attach")
        assert attached["FEEDD_FEED"] == "web"
        assert attached["FEEDD_RANK"] == "2" and attached["FEEDD_WORLD"] == "3"
        assert attached["FEEDD_CLIENT_PID"] == str(client.pid)
        assert attached["FEEDD_CLIENT_UID"] == str(os.getuid())
        assert int(attached["FEEDD_CLIENT_ID"]) > 0
        assert attached["PRIORITY"] == "6" and attached["SYSLOG_IDENTIFIER"] == "feedd"
        # The message is the text alone: the journal adds the identifier, pid and level itself.
        assert attached["MESSAGE"].startswith("client ") and "feedd[" not in attached["MESSAGE"]
        detached = read_until(lambda e: "detached from feed web" in e.get("MESSAGE", ""), "about the detach")
        assert detached["FEEDD_CLIENT_PID"] == str(client.pid) and detached["FEEDD_RANK"] == "2"
        # Lines about no client carry no client fields.
        ready = read_until(lambda e: "ready" in e.get("MESSAGE", ""), "saying feedd is ready")
        assert ready["PRIORITY"] == "5" and not any(k.startswith("FEEDD_") for k in ready)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        journal.close()
        stderr.close()
    assert rc == 0
    # Everything went to the journal, nothing to stderr.
    assert (tmp_path / "stderr").read_text() == ""
