# SPDX-License-Identifier: MIT
"""Hostile and buggy clients against a real feedd (issue #8, server side):
bytes that are not the protocol, oversized and unknown messages, wrong
versions, file descriptors nobody asked for, a tail past the ring, floods of
connections, peers the allow lists refuse, rings over the memory limits, a
client that dies while a child still holds its socket, and one that stops
consuming. Each is refused or disconnected, counted in `feedctl status
--json`, logged once, and the daemon keeps serving a well-behaved client
throughout.

What a client must not be able to do, tried the same way:
- write the batch ring: the ring memfd is sealed (shrink, grow, future write,
  seal), so mapping it writable, mprotect(PROT_WRITE) on a read-only mapping,
  ftruncate, fallocate, write() -- directly or through a fresh open of
  /proc/self/fd/N -- all fail, and the bytes the daemon published stay as
  they were;
- make the daemon read a file of its choosing: a feed is a name from the
  daemon's config; paths, globs and traversals are unknown feed names;
- get a ring whose memory is not there: the ring is fallocate()d at attach,
  so an attach that cannot get its memory is refused with a clear error, and
  rings handed out before keep working (no SIGBUS later).

The raw protocol is spoken here from docs/protocol.md, not through libfeed
(which maps the ring read-only, closes the fds and validates what it reads),
so the test can do and say what libfeed never would.
"""

import array
import ctypes
import errno
import mmap
import os
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import FEEDCTL, feed_conf, gen_megatron, open_fds, reference, remove_cgroup, wait_attached

MAGIC = 0x57444546
HELLO, HELLO_REPLY, ATTACH, ATTACH_REPLY, ERROR, STATUS, STATUS_REPLY, DETACH = range(1, 9)
NAME_MAX, CURSOR_MAX, MESSAGE_MAX = 64, 512, 512


def header(type_, length, version=1, magic=MAGIC, reserved=0):
    return struct.pack("<IHHII", magic, version, type_, length, reserved)


def hello(min_v=1, max_v=1, name=b"hostile"):
    return header(HELLO, 40) + struct.pack("<HHI32s", min_v, max_v, os.getpid(), name)


def attach(feed, rank=0, world=1):
    return header(ATTACH, 16 + NAME_MAX + CURSOR_MAX) + struct.pack(
        f"<IIII{NAME_MAX}s{CURSOR_MAX}s", rank, world, 0, 0, feed.encode(), b"")


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def recv_exact(s, n, fds=None):
    buf = b""
    while len(buf) < n:
        if fds is None:
            chunk = s.recv(n - len(buf))
        else:
            chunk, got, _, _ = socket.recv_fds(s, n - len(buf), 8)
            fds.extend(got)
        if not chunk:
            raise ConnectionResetError("EOF")
        buf += chunk
    return buf


def recv_msg(s, fds=None):
    magic, version, type_, length, _ = struct.unpack("<IHHII", recv_exact(s, 16, fds))
    assert magic == MAGIC and version == 1
    return type_, recv_exact(s, length, fds) if length else b""


def error_of(payload):
    code, _ = struct.unpack("<iI", payload[:8])
    return code, payload[8:].split(b"\0", 1)[0].decode()


def closed_by_peer(s, timeout=5):
    """True when the daemon closed the connection (EOF or reset) within timeout; replies before it are skipped."""
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def status(sock_path):
    import json
    p = subprocess.run([str(FEEDCTL), "--socket", sock_path, "status", "--json"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    gen_megatron.main([str(d), "--shards", "2", "--docs-per-shard", "200", "--mean-len", "300", "--seed", "5"])
    return d


def web(data, extra=""):
    return extra + feed_conf("web", f"{data}/shard_*.idx", seq_len=64, batch_size=2)


def batches_of(proc_out):
    return [l for l in proc_out.splitlines() if l.startswith("batch")]


def test_protocol_abuse_is_dropped_counted_logged_once_and_others_stream_on(daemon, data, tmp_path):
    d = daemon(web(data))
    base = open_fds(d.proc.pid)
    ref = d.client("web", 0, 1, 300)
    ref_out, _ = ref.communicate(timeout=60)
    good = d.client("web", 0, 1, 300, sleep_ms=2)  # streams through all of what follows

    cases = {
        "bad_magic": [b"GET / HTTP/1.1\r\nHost: feedd\r\n\r\n"],
        "oversized": [header(HELLO, 1 << 20)],
        "unknown_type": [header(200, 0)],
        "bad_version": [hello(), header(STATUS, 8, version=2) + b"\0" * 8],
        "bad_message": [header(ATTACH, 0)],             # before HELLO, and empty
    }
    for kind, msgs in cases.items():
        s = connect(d.socket)
        for m in msgs:
            s.sendall(m)
        assert closed_by_peer(s), f"{kind}: still connected"
        s.close()

    # A truncated payload after a good HELLO.
    s = connect(d.socket)
    s.sendall(hello())
    assert recv_msg(s)[0] == HELLO_REPLY
    s.sendall(header(STATUS, 4) + b"\0" * 4)
    assert closed_by_peer(s)
    s.close()

    # A HELLO of versions this daemon does not speak gets an answer, then the door.
    s = connect(d.socket)
    s.sendall(hello(7, 9))
    t, p = recv_msg(s)
    assert t == ERROR
    code, text = error_of(p)
    assert code == -93, (code, text)  # -EPROTONOSUPPORT
    assert "protocol versions 7..9 are not supported" in text
    assert closed_by_peer(s)
    s.close()

    # File descriptors nobody asked for.
    s = connect(d.socket)
    r, w = os.pipe()
    socket.send_fds(s, [hello()], [r, w])
    os.close(r)
    os.close(w)
    assert closed_by_peer(s)
    s.close()

    out, err = good.communicate(timeout=120)
    assert good.returncode == 0, err
    assert batches_of(out) == batches_of(ref_out), "the well-behaved client's stream changed"

    st = status(d.socket)["daemon"]
    dropped = st["dropped"]
    assert dropped["bad_magic"] == 1 and dropped["oversized"] == 1 and dropped["unknown_type"] == 1
    assert dropped["bad_version"] == 2 and dropped["bad_message"] == 2 and dropped["passed_fds"] == 1
    assert st["protocol_errors"] == sum(dropped.values()) == 8
    log = d.log_text()
    for needle in ["not a feedd message (magic", "sent a message of 1048576 bytes", "unknown message type 200",
                   "protocol version 2", "speaks protocol versions 7..9", "sent file descriptors"]:
        assert log.count(needle) == 1, (needle, log)
    assert open_fds(d.proc.pid) == base, "a dropped connection left an fd behind"


def test_a_tail_past_the_ring_stops_that_client_only(daemon, data):
    d = daemon(web(data))
    good = d.client("web", 1, 2, 200, sleep_ms=2)
    s = connect(d.socket)
    s.sendall(hello())
    assert recv_msg(s)[0] == HELLO_REPLY
    s.sendall(attach("web", 0, 2))
    fds = []
    t, p = recv_msg(s, fds)
    assert t == ATTACH_REPLY and len(fds) == 4, (t, p)
    ring_fd, cons_fd, data_efd, space_efd = fds
    cons = mmap.mmap(cons_fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    cons[64:72] = struct.pack("<Q", 1 << 40)  # tail: released far more than was ever published
    os.write(space_efd, struct.pack("<Q", 1))
    t, p = recv_msg(s)
    assert t == ERROR and error_of(p)[0] == -71, error_of(p)  # -EPROTO
    assert closed_by_peer(s)
    cons.close()
    for fd in fds:
        os.close(fd)
    s.close()
    out, err = good.communicate(timeout=60)
    assert good.returncode == 0 and len(batches_of(out)) == 200, err
    st = status(d.socket)["daemon"]
    assert st["dropped"]["ring_protocol"] == 1


def test_connection_flood_is_refused_past_the_limit(daemon, data):
    # admin_connections = 0: the test runs as root, which may otherwise use the slots kept for operators.
    d = daemon(web(data, "[feedd]\nmax_connections = 8\nmax_connections_per_uid = 8\nadmin_connections = 0\n"))
    good = d.client("web", 0, 1, 10**6, sleep_ms=5)
    assert good.stdout.readline() == "attached\n"
    flood = []
    refused = 0
    for _ in range(50):
        s = connect(d.socket)
        s.sendall(hello())
        t, p = recv_msg(s)
        if t == ERROR:
            code, text = error_of(p)
            assert code == -87 and "max_connections" in text, (code, text)  # -EUSERS
            assert closed_by_peer(s)
            s.close()
            refused += 1
        else:
            assert t == HELLO_REPLY
            flood.append(s)
    assert len(flood) == 7 and refused == 43  # 8 connections, the streaming client's among them
    # The streaming client never noticed.
    line = good.stdout.readline()
    assert line.startswith("batch"), line
    for s in flood:
        s.close()
    time.sleep(0.3)
    st = status(d.socket)["daemon"]  # a new connection is welcome again
    assert st["refused"]["limit"] == 43
    # One line for the first refusal of a second, one summing up the rest at the next tick: not 43.
    deadline = time.time() + 3
    while not re.search(r"\d+ more connections refused in the last second \(over a connection limit\)", d.log_text()):
        assert time.time() < deadline, d.log_text()
        time.sleep(0.1)
    assert 1 <= d.log_text().count("refused: max_connections") <= 3, d.log_text()
    good.kill()
    good.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user (setpriv)")
def test_allow_lists_refuse_other_users_with_pid_and_uid_logged(tmp_path, data):
    from conftest import Daemon
    sockdir = tempfile.mkdtemp(prefix="feedd-hostile-")
    os.chmod(sockdir, 0o755)
    nobody = pwd.getpwnam("nobody")
    conf = web(data, "[feedd]\nsocket_mode = 0666\nallow_users = daemon\n")
    d = Daemon(sockdir, conf)  # its socket under a directory nobody may traverse into
    try:
        as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                     str(FEEDCTL), "--socket", d.socket, "status"]
        p = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
        # libfeed's connect reports the code (the daemon's ERROR says -EACCES); the log has who it was.
        assert p.returncode == 1 and "permission denied" in p.stderr and "allow_users" in p.stderr, p.stderr
        log = d.log_text()
        assert re.search(rf"connection from pid \d+ \(uid {nobody.pw_uid}, gid {nobody.pw_gid}\) refused: "
                         r"not in allow_users or allow_groups", log), log
        assert status(d.socket)["daemon"]["refused"]["credentials"] == 1  # root always may

        # Allowed by group instead: a reload applies it.
        d.conf.write_text(d.conf.read_text().replace("allow_users = daemon", f"allow_groups = {nobody.pw_gid}"))
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while "reloaded" not in d.log_text():
            assert time.time() < deadline
            time.sleep(0.05)
        p = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
    finally:
        assert d.stop() == 0
        shutil.rmtree(sockdir, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect with other credentials (setpriv)")
def test_allow_groups_sees_every_supplementary_group(tmp_path, data):
    """A peer in 70 supplementary groups whose access comes from the 70th: SO_PEERGROUPS returns ERANGE for a
    64-entry buffer, and the daemon must ask again with the length it was told, not drop the list."""
    from conftest import Daemon
    sockdir = tempfile.mkdtemp(prefix="feedd-groups-")
    os.chmod(sockdir, 0o755)
    nobody = pwd.getpwnam("nobody")
    groups = list(range(61000, 61070))  # 70 gids; the kernel takes them as numbers, no /etc/group entries needed
    d = Daemon(sockdir, web(data, f"[feedd]\nsocket_mode = 0666\nallow_groups = {groups[-1]}\n"))

    def status_as(gids):
        cmd = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--groups=" + ",".join(map(str, gids)),
               str(FEEDCTL), "--socket", d.socket, "status"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)

    try:
        p = status_as(groups)
        assert p.returncode == 0, p.stderr
        p = status_as(groups[:-1])  # the same peer without the allowed group: refused
        assert p.returncode == 1 and "permission denied" in p.stderr, p.stderr
        assert status(d.socket)["daemon"]["refused"]["credentials"] == 1
    finally:
        assert d.stop() == 0
        shutil.rmtree(sockdir, ignore_errors=True)


def test_ring_memory_limits_refuse_attaches_with_a_clear_error(daemon, data, tmp_path):
    # One ring of 4 slots x (1024 + ~3*2*64*4 -> 4096) + 4096 header + 8192 consumer page = 28672 bytes.
    d = daemon(web(data, "[feedd]\nmemory_max = 60000\n"))
    a = d.client("web", 0, 3, 10**6, hold=True)
    b = d.client("web", 1, 3, 10**6, hold=True)
    assert a.stdout.readline() == "attached\n" and b.stdout.readline() == "attached\n"
    c = d.client("web", 2, 3, 10)
    out, err = c.communicate(timeout=30)
    assert c.returncode == 1
    assert "passes feedd's memory_max (60000 bytes)" in err, err
    st = status(d.socket)["daemon"]
    assert st["refused"]["memory"] == 1 and st["ring_memory_bytes"] == 2 * 28672
    a.kill()
    a.wait()
    deadline = time.time() + 5
    while status(d.socket)["daemon"]["ring_memory_bytes"] != 28672:
        assert time.time() < deadline
        time.sleep(0.05)
    c = d.client("web", 2, 3, 10)
    c.communicate(timeout=30)
    assert c.returncode == 0
    b.kill()
    b.wait()

    p = d.ctl("dump", "web", "--batches", "1", "--out", str(tmp_path / "o"), check=False)
    assert p.returncode == 0


def test_client_memory_max_is_per_ring(daemon, data):
    d = daemon(web(data, "[feedd]\nclient_memory_max = 16K\n"))
    c = d.client("web", 0, 1, 10)
    _, err = c.communicate(timeout=30)
    assert c.returncode == 1 and "passes feedd's client_memory_max (16384 bytes)" in err, err


CHILD_HOLDS_SOCKET = r"""
import os, socket, struct, sys, time
sys.path.insert(0, sys.argv[2])
from test_hostile import hello, attach, recv_msg, connect
s = connect(sys.argv[1])
s.sendall(hello())
recv_msg(s)
s.sendall(attach("web"))
fds = []
t, _ = recv_msg(s, fds)
assert t == 4, t
child = os.fork()
if child == 0:              # the child inherits the socket and the ring, and lives on
    time.sleep(120)
    os._exit(0)
print("attached", child, flush=True)
time.sleep(120)
"""


def test_a_dead_client_is_reclaimed_within_a_second_even_if_its_socket_lives_on(daemon, data):
    d = daemon(web(data))
    p = subprocess.Popen([sys.executable, "-c", CHILD_HOLDS_SOCKET, d.socket, os.path.dirname(__file__)],
                         stdout=subprocess.PIPE, text=True)
    child = None
    try:
        word, child = p.stdout.readline().split()
        assert word == "attached"
        st = status(d.socket)
        assert len(st["clients"]) == 1 and st["clients"][0]["pid"] == p.pid
        p.send_signal(signal.SIGKILL)
        p.wait()
        t0 = time.time()
        while status(d.socket)["clients"]:
            assert time.time() - t0 < 1.0, "the dead client's ring was not reclaimed within a second"
            time.sleep(0.05)
        st = status(d.socket)
        assert st["daemon"]["clients_reaped"] == 1 and st["feeds"][0]["clients"] == 0
        assert f"(pid {p.pid}, uid {os.getuid()}): the process exited; reclaiming its ring" in d.log_text()
    finally:
        p.kill()
        p.wait()
        if child:
            try:
                os.kill(int(child), signal.SIGKILL)  # the orphan that still held the socket
            except ProcessLookupError:
                pass


def test_a_client_that_stops_consuming_is_reported_and_blocks_nobody(daemon, data):
    d = daemon(web(data, "[feedd]\nstuck_client_s = 1\n"))
    stuck = d.client("web", 0, 2, 10**6, hold=True)
    assert stuck.stdout.readline() == "attached\n"
    assert stuck.stdout.readline().startswith("batch")
    good = d.client("web", 1, 2, 400)
    deadline = time.time() + 10
    while True:
        st = status(d.socket)
        mine = [c for c in st["clients"] if c["pid"] == stuck.pid]
        if mine and mine[0]["stuck"]:
            break
        assert time.time() < deadline, st
        time.sleep(0.2)
    out, err = good.communicate(timeout=60)
    assert good.returncode == 0 and len(batches_of(out)) == 400, err
    assert st["daemon"]["stuck_clients"] == 1
    assert mine[0]["idle_s"] >= 1
    log = d.log_text()
    assert log.count("has released no batch for") == 1, log
    assert re.search(rf"client \d+ \(pid {stuck.pid}, uid \d+\) on feed web rank 0/2 has released no batch", log)
    stuck.kill()
    stuck.wait()


# ---- what a client must not be able to do ----

WIRE_MAGIC = 0x57444546
HELLO, HELLO_REPLY, ATTACH, ATTACH_REPLY, ERROR = 1, 2, 3, 4, 5
F_GET_SEALS = 1034
F_ADD_SEALS = 1033
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE = 1, 2, 4, 8, 16

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.fcntl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value


class RawClient:
    """HELLO and ATTACH over the wire, keeping every fd the daemon passes."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(path)
        self.fds = []
        payload = struct.pack("<HHI", 1, 1, os.getpid()) + b"raw-client".ljust(32, b"\0")
        self.send(HELLO, payload)
        typ, _ = self.recv()
        assert typ == HELLO_REPLY

    def send(self, typ, payload):
        self.sock.sendall(struct.pack("<IHHII", WIRE_MAGIC, 1, typ, len(payload), 0) + payload)

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            data, fds, _, _ = socket.recv_fds(self.sock, n - len(buf), 8)
            self.fds += fds
            if not data:
                raise ConnectionResetError("feedd closed the connection")
            buf += data
        return buf

    def recv(self):
        magic, _, typ, length, _ = struct.unpack("<IHHII", self._recv_exact(16))
        assert magic == WIRE_MAGIC
        return typ, self._recv_exact(length)

    def attach(self, feed, rank=0, world=1):
        name = feed.encode() if isinstance(feed, str) else feed
        self.send(ATTACH, struct.pack("<IIII", rank, world, 0, 0) + name.ljust(64, b"\0") + bytes(512))
        typ, p = self.recv()
        if typ == ERROR:
            code, _ = struct.unpack_from("<iI", p)
            return code, p[8:].split(b"\0")[0].decode()
        assert typ == ATTACH_REPLY, typ
        ring_size, cons_size, _, _, slots, b, l, n_fds = struct.unpack("<QQQQIIII", p)
        assert n_fds == 4 and len(self.fds) == 4
        return 0, dict(ring_size=ring_size, consumer_size=cons_size, slots=slots, batch_size=b, seq_len=l)

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()


def wait_for(cond, timeout=10, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {timeout} s")


def test_a_client_cannot_write_its_ring(daemon, dataset, tmp_path):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", eos=50256))
    c = RawClient(d.socket)
    code, info = c.attach("web")
    assert code == 0, info
    ring_fd, size = c.fds[0], info["ring_size"]
    seals = libc.fcntl(ring_fd, F_GET_SEALS, 0)
    assert seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL
    assert seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE), f"ring has no write seal (seals {seals:#x})"

    ro = mmap.mmap(ring_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    wait_for(lambda: struct.unpack_from("<Q", ro, 64)[0] >= 2, what="two published batches")
    # The daemon fills every slot the client has not taken: the snapshot is taken once the ring is full.
    prev = -1
    while (cur := struct.unpack_from("<Q", ro, 64)[0]) != prev:
        prev = cur
        time.sleep(0.5)
    before = bytes(ro[:])

    with pytest.raises(PermissionError):
        mmap.mmap(ring_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, ring_fd, 0)
    assert addr not in (None, MAP_FAILED)
    assert libc.mprotect(addr, size, mmap.PROT_READ | mmap.PROT_WRITE) == -1
    assert ctypes.get_errno() in (errno.EACCES, errno.EPERM)
    libc.munmap(addr, size)
    for shrink_or_grow in (0, size - 4096, size + 4096):
        with pytest.raises(PermissionError):
            os.ftruncate(ring_fd, shrink_or_grow)
    with pytest.raises(PermissionError):
        os.posix_fallocate(ring_fd, size, 4096)
    with pytest.raises(PermissionError):
        os.pwrite(ring_fd, b"\xff" * 64, 64)
    with pytest.raises(PermissionError):
        os.write(ring_fd, b"\xff")
    # Seals cannot be taken back or added to.
    assert libc.fcntl(ring_fd, F_ADD_SEALS, F_SEAL_WRITE) == -1 and ctypes.get_errno() == errno.EPERM
    # A fresh writable open of the same memfd is a new file description, but the seals are the inode's.
    rw = os.open(f"/proc/self/fd/{ring_fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.pwrite(rw, b"\xff" * 64, 64)
        with pytest.raises(PermissionError):
            mmap.mmap(rw, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(rw)
    # Nothing the daemon published was touched (the client released nothing, so nothing moved).
    assert bytes(ro[:4096 + 2 * 4096])[:64] == before[:64]
    assert struct.unpack_from("<Q", ro, 64)[0] == struct.unpack_from("<Q", before, 64)[0]
    ro.close()
    c.close()

    # Other clients are served exactly as before.
    got = d.dump("web", tmp_path / "after", batches=5)
    exp = reference(f"{dataset}/shard_*.idx", 0, 1, 5, eos=50256)
    for i, e in enumerate(exp):
        assert (got["input_ids"][i] == e["input_ids"]).all(), f"batch {i}"


def test_a_bogus_tail_in_the_consumer_page_stops_only_that_client(daemon, dataset, tmp_path):
    """The consumer page is the client's to write; the daemon must not believe it."""
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"))
    other = d.client("web", 1, 2, 60, sleep_ms=5)
    wait_attached(d, other)
    c = RawClient(d.socket)
    code, info = c.attach("web", rank=0, world=2)
    assert code == 0, info
    cons = mmap.mmap(c.fds[1], 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    struct.pack_into("<Q", cons, 64, 1 << 40)  # released batches that were never published
    os.write(c.fds[3], struct.pack("<Q", 1))  # and wake the daemon so it looks
    c.sock.settimeout(10)
    try:
        typ, p = c.recv()
        assert typ == ERROR, typ
        assert struct.unpack_from("<i", p)[0] == -errno.EPROTO
    except ConnectionResetError:
        pass  # dropped without a word is as good
    cons.close()
    c.close()
    out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    assert sum(line.startswith("batch ") for line in out.splitlines()) == 60


@pytest.mark.parametrize("name", ["/etc/passwd", "../feedd0.conf", "web/../web", "*", "shard_000.idx",
                                  "/proc/self/environ", "web\n[feed.x]"])
def test_feeds_are_defined_only_by_the_config(daemon, dataset, tmp_path, name):
    if name == "shard_000.idx":
        name = f"{dataset}/shard_000.idx"
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"))
    base = open_fds(d.proc.pid)
    c = RawClient(d.socket)
    code, msg = c.attach(name.encode()[:63])
    assert code == -errno.ENOENT, (code, msg)
    assert "no feed named" in msg, msg
    c.close()
    assert [f["name"] for f in d.status()["feeds"]] == ["web"]
    assert open_fds(d.proc.pid) == base
    targets = {os.readlink(f"/proc/{d.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{d.proc.pid}/fd")
               if os.path.exists(f"/proc/{d.proc.pid}/fd/{fd}")}
    assert "/etc/passwd" not in targets


def test_ring_memory_is_allocated_at_attach(daemon, dataset):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", seq_len=1024, batch_size=8))
    c = RawClient(d.socket)
    code, info = c.attach("web")
    assert code == 0, info
    st = os.fstat(c.fds[0])
    assert st.st_size == info["ring_size"]
    # A sparse memfd would get its pages on first write: out of memory then is a SIGBUS.
    assert st.st_blocks * 512 >= st.st_size, f"ring has {st.st_blocks * 512} of {st.st_size} bytes allocated"
    c.close()


MEMCG = Path("/sys/fs/cgroup/memory")


def memory_cgroup(tmp_path, limit):
    """A cgroup-v1 memory group with the OOM killer off: a charge over the limit fails with ENOMEM."""
    if os.geteuid() != 0 or not (MEMCG / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup-v1 memory controller to limit feedd's memory")
    cg = MEMCG / f"feedd-test-{os.getpid()}-{tmp_path.name}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        (cg / "memory.oom_control").write_text("1")
    except OSError as e:
        pytest.skip(f"cannot set up a memory cgroup: {e}")
    return cg


def test_an_attach_that_cannot_get_its_memory_is_refused_and_others_keep_reading(daemon, dataset, tmp_path):
    small = feed_conf("small", f"{dataset}/shard_*.idx", seq_len=256, batch_size=4)
    # 64 x 65536 tokens per batch: 4 slots of 64 MiB each.
    big = feed_conf("big", f"{dataset}/shard_*.idx", seq_len=65536, batch_size=64)
    cg = memory_cgroup(tmp_path, 96 << 20)
    d = daemon(small + "\n" + big)
    try:
        # Charges made from now on count against the 96 MiB.
        (cg / "cgroup.procs").write_text(str(d.proc.pid))
        early = d.client("small", 0, 1, 300, sleep_ms=2)
        wait_attached(d, early)

        t0 = time.time()
        p = d.dump("big", tmp_path / "big", batches=1, check=False)
        assert p.returncode == 1
        assert "memory" in p.stderr.lower(), p.stderr
        assert time.time() - t0 < 30

        out, err = early.communicate(timeout=120)
        assert early.returncode == 0, err
        assert sum(line.startswith("batch ") for line in out.splitlines()) == 300
        got = d.dump("small", tmp_path / "small", batches=3)
        exp = reference(f"{dataset}/shard_*.idx", 0, 1, 3)
        assert all((got["input_ids"][i] == e["input_ids"]).all() for i, e in enumerate(exp))
        assert d.proc.poll() is None
    finally:
        if d.proc.poll() is None:
            d.stop()
        remove_cgroup(cg)
