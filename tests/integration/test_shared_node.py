# SPDX-License-Identifier: MIT
"""A root feedd on a node many users share (issue #18, findings 1-5 and 10).

Each test plays a hostile or careless local user against a real feedd run by
root: unprivileged users are made with useradd for the test (feedd-t-*) and
removed after it, and act through setpriv. Without root the tests skip
(exit 77 under meson) and say so.

1. an impostor daemon in a socket directory another user made: feedd refuses
   to bind there, and root's feedctl, a C client and the Python package
   refuse to talk to it (SO_PEERCRED) before sending a byte;
2. a socket directory others can write, with an attacker swapping a symlink
   in after bind(): feedd refuses the directory, and a root-only file is left
   as it was;
3. four users holding 64 idle connections each: they are closed after
   handshake_timeout_s, another user's trainer gets in at once, and root's
   feedctl status gets in even when every ordinary slot is taken;
4. out of file descriptors (RLIMIT_NOFILE 64) with clients piling up: no log
   flood, no busy loop, and it serves again once they leave;
5. a ring larger than the memory cgroup allows: refused with ENOMEM, feedd
   is not OOM-killed; one user's rings are bounded by default (uid_memory_max);
10. RSS returns after 1,500 clients came and went; 1,000 feeds over the same
   files hold one fd per file; an idle daemon with 10,000 shards uses no CPU.
"""

import os
import pwd
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (FEEDCTL, RSS_IS_FEEDDS, RSS_SKIP_REASON, STREAM_CLIENT, Daemon, feed_conf, open_fds, remove_cgroup,
                      use_feed_package)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes users with useradd and acts as them "
                                                          "(setpriv)")

MAGIC = 0x57444546
HELLO, HELLO_REPLY = 1, 2


def header(type_, length):
    return struct.pack("<IHHII", MAGIC, 1, type_, length, 0)


def hello(name=b"idle"):
    return header(HELLO, 40) + struct.pack("<HHI32s", 1, 1, os.getpid(), name)


@pytest.fixture(scope="module")
def users():
    """Five unprivileged users made for this test module, removed after it."""
    if not shutil.which("useradd"):
        pytest.skip("needs useradd to make unprivileged users")
    tag = secrets.token_hex(3)
    made = []
    try:
        for i in range(5):
            name = f"feedd-t-{tag}-{i}"
            r = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                               capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"useradd {name} failed: {r.stderr.strip()}")
            made.append(pwd.getpwnam(name))
        yield made
    finally:
        for u in made:
            subprocess.run(["userdel", "--force", u.pw_name], capture_output=True)


def as_user(u):
    return ["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups"]


@pytest.fixture
def sockdir():
    """A directory for feedd's socket that every user may traverse (pytest's tmp_path is root's only)."""
    d = tempfile.mkdtemp(prefix="feedd-sn-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def started():
    ds = []
    yield ds
    for d in ds:
        rc = d.stop()
        assert rc == 0, f"feedd exited with {rc} on SIGTERM:\n{d.log_text()}"


def web(dataset, extra="", mode="0666", **kw):
    return f"[feedd]\nsocket_mode = {mode}\n{extra}\n" + feed_conf("web", f"{dataset}/shard_*.idx", **kw)


FAKE_DAEMON = r"""
import os, socket, struct, sys
path, log = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(2)
    got = b""
    try:
        while len(got) < 52:
            b = c.recv(4096)
            if not b:
                break
            got += b
    except OSError:
        pass
    with open(log, "ab") as f:
        f.write(got)
    # A forged HELLO_REPLY: "this is feedd 6.6.6".
    try:
        c.sendall(struct.pack("<IHHII", 0x57444546, 1, 2, 44, 0) + struct.pack("<HHII32s", 1, 0, os.getpid(), 0, b"6.6.6-forged"))
    except OSError:
        pass
    c.close()
"""


def test_1_an_impostor_daemon_in_another_users_directory_is_refused(users, dataset, tmp_path):
    mallory = users[0]
    d = Path(tempfile.mkdtemp(prefix="feedd-hijack-"))
    try:
        os.chown(d, mallory.pw_uid, mallory.pw_gid)  # as if mallory had made it first
        os.chmod(d, 0o755)
        path = d / "feedd.sock"
        log = d / "received"
        fake = subprocess.Popen(as_user(mallory) + [sys.executable, "-c", FAKE_DAEMON, str(path), str(log)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert fake.stdout.readline() == "ready\n"
            p = subprocess.run([str(FEEDCTL), "--socket", str(path), "status"], capture_output=True, text=True,
                               timeout=30)
            assert p.returncode != 0, p.stdout
            assert "6.6.6" not in p.stdout
            assert "refusing to talk to the daemon" in p.stderr and f"uid {mallory.pw_uid}" in p.stderr, p.stderr
            assert "FEED_DAEMON_UID" in p.stderr, p.stderr
            c = subprocess.run([str(STREAM_CLIENT), str(path), "web", "0", "1", "1"], capture_output=True,
                               text=True, timeout=30)
            assert c.returncode == 1 and "refusing to talk to the daemon" in c.stderr, c.stderr
            # The Python package connects through libfeed: the same refusal, as a FeedError.
            py = ("import errno, sys, feed\ntry:\n    feed.Loader('web', socket=sys.argv[1])\nexcept feed.FeedError as e:\n"
                  "    print(e.code == -errno.EPERM, e)\n")
            env = {**os.environ, "PYTHONPATH": use_feed_package(), "FEEDD_BUILD_DIR": str(Path(FEEDCTL).parents[2])}
            q = subprocess.run([sys.executable, "-c", py, str(path)], capture_output=True, text=True, timeout=60,
                               env=env)
            assert q.stdout.startswith("True ") and "refusing to talk to the daemon" in q.stdout, q.stdout + q.stderr
            time.sleep(0.2)
            assert not log.exists() or log.read_bytes() == b"", "a client sent the impostor its HELLO"

            # The operator who does trust that uid says so.
            p = subprocess.run([str(FEEDCTL), "--socket", str(path), "status"], capture_output=True, text=True,
                               timeout=30, env={**os.environ, "FEED_DAEMON_UID": str(mallory.pw_uid)})
            assert "refusing to talk" not in p.stderr, p.stderr
            assert log.read_bytes()[:4] == struct.pack("<I", MAGIC)
        finally:
            fake.kill()
            fake.wait()

        # feedd itself will not bind in mallory's directory: she could swap the socket at any time.
        path.unlink()
        conf = tmp_path / "feedd.conf"
        conf.write_text(web(dataset))
        p = subprocess.run([str(Path(FEEDCTL).parents[2] / "daemon" / "feedd"), "-c", str(conf), "-s", str(path)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode != 0
        assert f"socket directory {d} is owned by uid {mallory.pw_uid}" in p.stderr, p.stderr
        assert "RuntimeDirectory" in p.stderr, p.stderr
        assert not path.exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)


SWAP_SHIM = Path(FEEDCTL).parents[2] / "tests" / "integration" / "swap-after-bind.so"
FEEDD_BIN = Path(FEEDCTL).parents[2] / "daemon" / "feedd"


def test_2_a_socket_directory_others_can_write_is_refused(users, dataset, tmp_path):
    d = Path(tempfile.mkdtemp(prefix="feedd-swap-"))
    try:
        os.chmod(d, 0o777)  # python.md's kind of example: a socket directory anyone can write
        conf = tmp_path / "feedd.conf"
        conf.write_text(web(dataset))
        p = subprocess.run([str(FEEDD_BIN), "-c", str(conf), "-s", str(d / "feedd.sock")], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode != 0
        assert f"socket directory {d} is writable by others (mode 0777)" in p.stderr, p.stderr
        assert not (d / "feedd.sock").exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_2_a_symlink_swapped_in_after_bind_changes_nothing(users, dataset, sockdir, tmp_path):
    """The attacker wins the race after bind() every time (an LD_PRELOAD shim swaps the socket for a symlink
    to a root-only file as bind returns): what feedd does next must not reach the file."""
    if not SWAP_SHIM.exists():
        pytest.skip(f"{SWAP_SHIM} is not built")
    group = users[1]  # a group given access to the socket: set after bind()
    target = tmp_path / "root-only"
    target.write_text("secret\n")
    os.chmod(target, 0o600)
    path = sockdir / "feedd.sock"
    conf = tmp_path / "feedd.conf"
    conf.write_text(web(dataset, f"socket_group = {group.pw_gid}", mode="0660"))
    p = subprocess.Popen([str(FEEDD_BIN), "-c", str(conf), "-s", str(path)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "LD_PRELOAD": str(SWAP_SHIM), "SWAP_PATH": str(path),
                              "SWAP_TARGET": str(target)})
    try:
        deadline = time.time() + 10
        while not path.is_symlink() and p.poll() is None:
            assert time.time() < deadline, "the shim never swapped"
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.communicate(timeout=10)
    st = os.stat(target)
    assert (st.st_mode & 0o777, st.st_gid) == (0o600, 0), \
        f"feedd changed {target} through a symlink: mode {st.st_mode & 0o777:o}, gid {st.st_gid}"


def test_2_the_socket_is_made_with_its_mode_and_group(users, dataset, sockdir, started):
    group = users[1]
    d = Daemon(sockdir, web(dataset, f"socket_group = {group.pw_gid}", mode="0660"))
    started.append(d)
    st = os.lstat(d.socket)
    assert (st.st_mode & 0o777, st.st_gid) == (0o660, group.pw_gid)


IDLE = r"""
import socket, sys, time
path, n, send_hello = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
held = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    if send_hello:
        import struct, os
        try:
            s.sendall(struct.pack("<IHHII", 0x57444546, 1, 1, 40, 0) + struct.pack("<HHI32s", 1, 1, os.getpid(), b"idle"))
        except OSError:
            pass  # refused (and closed) at once: out of fds, or over a limit
    held.append(s)
print("holding", flush=True)
time.sleep(float(sys.argv[4]))
"""


def hold(user, path, n, hello_too, seconds=60):
    p = subprocess.Popen(as_user(user) + [sys.executable, "-c", IDLE, path, str(n), "1" if hello_too else "0",
                                          str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line == "holding\n", p.stderr.read()
    return p


def timed_status(d):
    t0 = time.monotonic()
    p = d.ctl("status", "--json", check=False, timeout=30)
    return p, time.monotonic() - t0


def test_3_idle_connections_of_four_users_lock_nobody_out(users, dataset, sockdir, started):
    d = Daemon(sockdir, web(dataset))  # handshake_timeout_s: its default, 5 s
    started.append(d)
    holders = [hold(u, d.socket, 64, False) for u in users[:4]]
    try:
        # 256 connections that never said HELLO: another user's trainer and root's feedctl get in at once.
        trainer = subprocess.Popen(as_user(users[4]) + [str(STREAM_CLIENT), d.socket, "web", "0", "1", "20"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = trainer.communicate(timeout=60)
        assert trainer.returncode == 0, err
        assert out.count("batch ") == 20
        p, took = timed_status(d)
        assert p.returncode == 0, p.stderr
        # ... and after handshake_timeout_s the idle ones are gone, each told why.
        deadline = time.time() + 15
        while True:
            p = d.ctl("status", "--json")
            import json
            n = json.loads(p.stdout)["daemon"]["connections"]
            if n <= 1:
                break
            assert time.time() < deadline, f"{n} connections still open"
            time.sleep(0.3)
        assert "sent no HELLO within handshake_timeout_s (5 s)" in d.log_text()
        assert d.log_text().count("sent no HELLO") <= 10, "one line per second at most"
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_3_operators_keep_a_slot_when_every_ordinary_one_is_taken(users, dataset, sockdir, started):
    d = Daemon(sockdir, web(dataset, "max_connections = 16\nmax_connections_per_uid = 8"))
    started.append(d)
    a = hold(users[0], d.socket, 8, True)
    b = None
    try:
        p = subprocess.run(as_user(users[0]) + [str(FEEDCTL), "--socket", d.socket, "status"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode != 0 and "raise max_connections_per_uid" in p.stderr, p.stderr
        # Every ordinary slot is taken.
        b = hold(users[1], d.socket, 8, True)
        p = subprocess.run(as_user(users[2]) + [str(FEEDCTL), "--socket", d.socket, "status"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode != 0
        assert "reached max_connections (16" in p.stderr and "raise max_connections in" in p.stderr, p.stderr
        # Root still gets in: status and reload.
        p, took = timed_status(d)
        assert p.returncode == 0, p.stderr
        assert took < 2, took
        r = d.ctl("reload", check=False)
        assert r.returncode == 0, r.stderr
    finally:
        for h in (a, b):
            if h:
                h.kill()
                h.wait()


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def test_4_out_of_file_descriptors_is_neither_a_busy_loop_nor_a_log_flood(users, dataset, sockdir, started):
    if not shutil.which("prlimit"):
        pytest.skip("needs prlimit (util-linux) to lower feedd's RLIMIT_NOFILE")
    d = Daemon(sockdir, web(dataset))
    started.append(d)
    # feedd's own RLIMIT_NOFILE, soft and hard: 64 (as `ulimit -n 64` would before starting it).
    subprocess.run(["prlimit", f"--pid={d.proc.pid}", "--nofile=64:64"], check=True)
    base = len(open_fds(d.proc.pid))
    holders = [hold(u, d.socket, 40, True, seconds=120) for u in users[:3]]  # 120 connections > 64 fds
    try:
        time.sleep(1)
        lines0, cpu0 = len(d.log_text().splitlines()), cpu_seconds(d.proc.pid)
        time.sleep(5)
        lines1, cpu1 = len(d.log_text().splitlines()), cpu_seconds(d.proc.pid)
        assert lines1 - lines0 < 40, f"{lines1 - lines0} log lines in 5 s:\n" + d.log_text()[-3000:]
        assert cpu1 - cpu0 < 1.0, f"feedd used {cpu1 - cpu0:.2f} s of CPU in 5 s while out of fds"
        assert "out of file descriptors" in d.log_text()
        # One more client is told why, rather than left hanging.
        p = subprocess.run(as_user(users[3]) + [str(FEEDCTL), "--socket", d.socket, "status"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode != 0 and "out of file descriptors" in p.stderr, p.stderr
    finally:
        for h in holders:
            h.kill()
            h.wait()
    # Once they left, it serves again.
    deadline = time.time() + 10
    while True:
        p = d.ctl("status", check=False)
        if p.returncode == 0:
            break
        assert time.time() < deadline, p.stderr
        time.sleep(0.5)
    assert len(open_fds(d.proc.pid)) <= base + 2


MEMCG1 = Path("/sys/fs/cgroup/memory")
CG2 = Path("/sys/fs/cgroup")


def memory_cgroup(limit):
    """A memory cgroup (v2 if the machine has one with the memory controller, else v1) limited to limit bytes,
    with the OOM killer left on: a charge past it kills, as on a real node."""
    name = f"feedd-t-{os.getpid()}-{secrets.token_hex(3)}"
    if (CG2 / "cgroup.subtree_control").exists() and "memory" in (CG2 / "cgroup.subtree_control").read_text().split():
        cg, knob = CG2 / name, "memory.max"
    elif (MEMCG1 / "memory.limit_in_bytes").exists():
        cg, knob = MEMCG1 / name, "memory.limit_in_bytes"
    else:
        cg = None
    if cg:
        cg.mkdir()
        try:
            (cg / knob).write_text(str(limit))
        except OSError:
            cg.rmdir()
            raise
        return cg
    pytest.skip("no cgroup memory controller here (neither v2 with memory nor v1) to limit feedd's memory")


def test_5_a_ring_past_the_memory_cgroup_is_refused_not_oom_killed(dataset, sockdir, started, tmp_path):
    small = feed_conf("small", f"{dataset}/shard_*.idx", seq_len=256, batch_size=4)
    # 4 slots of 64 x 65536 tokens: about 256 MiB of ring, twice the group's 128 MiB.
    big = feed_conf("big", f"{dataset}/shard_*.idx", seq_len=65536, batch_size=64)
    try:
        cg = memory_cgroup(128 << 20)
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")
    d = Daemon(sockdir, "[feedd]\n" + small + "\n" + big)
    started.append(d)
    try:
        (cg / "cgroup.procs").write_text(str(d.proc.pid))
        p = d.dump("big", tmp_path / "big", batches=1, check=False)
        assert d.proc.poll() is None, f"feedd died ({d.proc.returncode}): OOM-killed?"
        assert p.returncode != 0
        assert "out of memory" in p.stderr.lower() and "memory cgroup" in p.stderr, p.stderr
        got = d.dump("small", tmp_path / "small", batches=3)
        assert got["input_ids"].shape[0] == 3
        assert "refused" in d.log_text() and "memory cgroup" in d.log_text()
    finally:
        if d.proc.poll() is None:
            d.stop()
        started.remove(d)
        remove_cgroup(cg)


def test_5_one_users_rings_are_bounded_by_default(users, dataset, sockdir, started, tmp_path):
    # 2 slots of 512 x 65536 tokens (about 1.1 GiB of ring): one fits uid_memory_max's default (2 GiB), two do not.
    d = Daemon(sockdir, "[feedd]\nsocket_mode = 0666\nring_slots = 2\n" +
               feed_conf("huge", f"{dataset}/shard_*.idx", seq_len=65536, batch_size=512))
    started.append(d)
    u = users[2]
    first = subprocess.Popen(as_user(u) + [str(STREAM_CLIENT), d.socket, "huge", "0", "2", "1000000", "-", "50",
                                           "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline()
        assert line == "attached\n", first.stderr.read()
        p = subprocess.run(as_user(u) + [str(STREAM_CLIENT), d.socket, "huge", "1", "2", "1"], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1 and "uid_memory_max" in p.stderr, p.stderr
    finally:
        first.kill()
        first.wait()


def rss_mb(pid):
    return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]) / 1024


def test_10_memory_returns_after_1500_clients_came_and_went(dataset, tmp_path, started):
    if not RSS_IS_FEEDDS:
        pytest.skip(RSS_SKIP_REASON)
    d = Daemon(tmp_path, "[feedd]\nmax_connections = 4000\nmax_connections_per_uid = 4000\n" +
               feed_conf("web", f"{dataset}/shard_*.idx", seq_len=2048, batch_size=8))
    started.append(d)
    time.sleep(0.5)
    start, fds0 = rss_mb(d.proc.pid), len(open_fds(d.proc.pid))
    peak = start
    for _ in range(3):  # 3 x 500 clients at once, each reading 10 batches
        ps = [subprocess.Popen([str(STREAM_CLIENT), d.socket, "web", str(i % 8), "8", "10", "-", "200"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(500)]
        for p in ps:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        peak = max(peak, rss_mb(d.proc.pid))
    time.sleep(2.5)  # a tick or two
    end = rss_mb(d.proc.pid)
    print(f"RSS {start:.1f} MB at start, {peak:.1f} MB at the peak, {end:.1f} MB after 1,500 clients left")
    assert end < start + 25, f"RSS {start:.1f} MB at start, {end:.1f} MB after 1,500 clients came and went"
    assert len(open_fds(d.proc.pid)) == fds0


def test_10_a_thousand_feeds_over_the_same_files_share_their_descriptors(dataset, tmp_path, started):
    feeds = "".join(feed_conf(f"f{i}", f"{dataset}/shard_00[01].idx") + "\n" for i in range(1000))
    d = Daemon(tmp_path, feeds)
    started.append(d)
    fds = open_fds(d.proc.pid)
    files = [os.readlink(f"/proc/{d.proc.pid}/fd/{fd}") for fd in fds if os.path.exists(f"/proc/{d.proc.pid}/fd/{fd}")]
    shards = [f for f in files if "/shard_00" in f]
    # 2 shards: 2 .idx and 2 .bin files, each open once, however many feeds read them.
    assert len(shards) <= 4, f"{len(shards)} descriptors on the 4 shard files; {len(fds)} in all"
    assert len(fds) < 100, len(fds)


def test_10_an_idle_daemon_with_10000_shards_costs_no_cpu(tmp_path, started):
    import gen_megatron
    data = tmp_path / "many"
    gen_megatron.main([str(data), "--shards", "10000", "--docs-per-shard", "1", "--mean-len", "20", "--seed", "5"])
    d = Daemon(tmp_path, feed_conf("many", f"{data}/shard_*.idx", seq_len=64, batch_size=2))
    started.append(d)
    time.sleep(1.5)
    cpu0 = cpu_seconds(d.proc.pid)
    time.sleep(5)
    used = cpu_seconds(d.proc.pid) - cpu0
    print(f"idle feedd with 10,000 shards: {used:.2f} s of CPU in 5 s")
    assert used < 0.06, f"{used:.2f} s of CPU in 5 s idle ({used / 5 * 100:.1f} % of a core)"
    # Still served: a client reads, and the check runs while it does.
    got = d.dump("many", tmp_path / "o", batches=2)
    assert got["input_ids"].shape[0] == 2


def rss_anon_mib(pid):
    return int([l for l in open(f"/proc/{pid}/status") if l.startswith("RssAnon:")][0].split()[1]) / 1024


def test_10_anonymous_memory_returns_to_its_start_after_waves_of_clients(dataset, tmp_path, started):
    """Waves of 300 clients attach, read and leave: feedd's anonymous memory (its heap, arenas, libevent's
    records) comes back to within 1 MiB of what it held before them. Before libevent's objects had slabs of
    their own (daemon/slab/slab.h), its per-fd records made during a wave pinned a heap page each: +3 MiB."""
    if not RSS_IS_FEEDDS:
        pytest.skip(RSS_SKIP_REASON)
    d = Daemon(tmp_path, "[feedd]\nmax_connections = 4000\nmax_connections_per_uid = 4000\n" +
               feed_conf("web", f"{dataset}/shard_*.idx", seq_len=2048, batch_size=8), threads=2)
    started.append(d)

    def wave(n):
        ps = [subprocess.Popen([str(STREAM_CLIENT), d.socket, "web", str(i % 8), "8", "10", "-", "200"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(n)]
        for p in ps:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        time.sleep(2.5)  # the tick trims the heap after departures

    # One client per rank first: the workers' scratch buffers (kept between batches, sized by the largest
    # batch, per worker not per client) are part of the start.
    wave(8)
    start, fds0 = rss_anon_mib(d.proc.pid), len(open_fds(d.proc.pid))
    after = []
    for _ in range(2):
        wave(300)
        after.append(rss_anon_mib(d.proc.pid))
    print(f"anonymous RSS {start:.2f} MiB at start, " + ", ".join(f"{a:.2f}" for a in after) + " after each wave")
    assert max(after) < start + 1.0, f"anonymous RSS {start:.2f} MiB at start, {after} MiB after waves of 300 clients"
    assert len(open_fds(d.proc.pid)) == fds0


RING_PROBE = r"""
import hashlib, mmap, os, socket, struct, sys, time
path = sys.argv[1]
for line in sys.stdin:
    feed, rank, world = line.split()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(path)
    fds = []
    def send(t, p):
        s.sendall(struct.pack("<IHHII", 0x57444546, 1, t, len(p), 0) + p)
    def exact(n):
        buf = b""
        while len(buf) < n:
            data, got, _, _ = socket.recv_fds(s, n - len(buf), 8)
            fds.extend(got)
            if not data:
                raise ConnectionResetError("feedd closed the connection")
            buf += data
        return buf
    def recv():
        _, _, typ, length, _ = struct.unpack("<IHHII", exact(16))
        return typ, exact(length)
    send(1, struct.pack("<HHI", 1, 1, os.getpid()) + b"ring-probe".ljust(32, b"\0"))
    assert recv()[0] == 2
    send(3, struct.pack("<IIII", int(rank), int(world), 0, 0) + feed.encode().ljust(64, b"\0") + bytes(512))
    typ, p = recv()
    assert typ == 4, p
    ring_size, _, _, _, slots, _, _, _ = struct.unpack("<QQQQIIII", p)
    m = mmap.mmap(fds[0], ring_size, prot=mmap.PROT_READ)
    deadline = time.time() + 30
    while struct.unpack_from("<Q", m, 64)[0] < slots:  # head: every slot written (nothing is released)
        assert time.time() < deadline, "the ring did not fill"
        time.sleep(0.005)
    header_size, _, slot_size = struct.unpack_from("<III", m, 12)
    h = hashlib.sha256()
    for i in range(slots):
        slot = bytearray(m[header_size + i * slot_size:header_size + (i + 1) * slot_size])
        slot[48:56] = bytes(8)  # produced_ns: when, not what
        h.update(slot)
    print(os.fstat(fds[0]).st_ino, h.hexdigest(), flush=True)
    m.close()  # as libfeed leaves: the ring unmapped, then DETACH (only such a ring's memory is reused)
    send(8, b"")
    for fd in fds:
        os.close(fd)
    s.close()
"""


def test_18_a_ring_reused_across_attaches_is_wiped_and_stays_with_its_uid(users, dataset, sockdir, started):
    """feedd keeps a departed client's ring memory for the next attach of the same uid (daemon/ring/ring.h,
    struct ring_pool: making and freeing a ring was most of an attach's cost under churn), once the client said
    DETACH having unmapped it (as libfeed does). The next ring of
    that uid holds exactly what a new ring would (nothing of the previous client's batches: every byte of
    every slot compared with another uid's new ring of the same stream), and another uid attaching while it
    is idle gets a ring of its own."""
    d = Daemon(sockdir, web(dataset, seq_len=256, batch_size=4))
    started.append(d)
    a_user, b_user = users[0], users[1]

    def probe(u):
        return subprocess.Popen(as_user(u) + [sys.executable, "-c", RING_PROBE, d.socket], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def ask(p, feed_rank_world):
        p.stdin.write(feed_rank_world + "\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert line, p.stderr.read()
        ino, digest = line.split()
        return int(ino), digest

    reused = 0
    for attempt in range(3):  # a ring idle for 0.5 s at a tick is let go: a slow machine may miss the reuse
        a, b = probe(a_user), probe(b_user)
        try:
            ino_a, first = ask(a, "web 0 2")           # A's first client: rank 0's batches
            ino_b, fresh = ask(b, "web 1 2")           # B, while A's ring is idle: a new ring, rank 1's batches
            ino_a2, again = ask(a, "web 1 2")          # A's next client, rank 1 too: A's ring again
        finally:
            for p in (a, b):
                p.stdin.close()
                p.wait(timeout=30)
        assert ino_b != ino_a, "another uid was given a departed client's ring memory"
        assert first != fresh, "rank 0's and rank 1's batches are the same: the comparison below proves nothing"
        assert again == fresh, "a reused ring's slots differ from a new ring's for the same stream: the previous " \
                               "client's bytes are left in them"
        if ino_a2 == ino_a:
            reused += 1
            break
    assert reused, "a uid's next attach never reused its idle ring memory"
