# SPDX-License-Identifier: MIT
"""What a client must not be able to do, tried by a real client of a real feedd.

- Write the batch ring: the ring memfd is sealed (shrink, grow, future write,
  seal), so mapping it writable, mprotect(PROT_WRITE) on a read-only mapping,
  ftruncate, fallocate, write() -- directly or through a fresh open of
  /proc/self/fd/N -- all fail, and the bytes the daemon published stay as
  they were.
- Make the daemon read a file of its choosing: a feed is a name from the
  daemon's config; paths, globs and traversals are unknown feed names.
- Get a ring whose memory is not there: the ring is fallocate()d at attach,
  so an attach that cannot get its memory is refused with a clear error, and
  rings handed out before keep working (no SIGBUS later).

The client here speaks the wire protocol itself (docs/protocol.md) rather than
through libfeed, which maps the ring read-only and closes the fds: a hostile
client does neither.
"""

import ctypes
import errno
import mmap
import os
import socket
import struct
import time
from pathlib import Path

import pytest

from conftest import feed_conf, open_fds, reference

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


def wait_attached(d, proc, timeout=30):
    """Waits until feedd lists proc as a client (reading its stdout here would buffer lines away from communicate())."""
    deadline = time.time() + timeout
    while proc.pid not in {c["pid"] for c in d.status()["clients"]}:
        assert proc.poll() is None, f"client exited with {proc.returncode}: {proc.stderr.read()}"
        assert time.time() < deadline, "client did not attach"
        time.sleep(0.02)


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
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
