#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""How each way of watching a shard sees a writer (issue #16; the choice is
in docs/reliability.md). On a scratch file of --size MiB, --rounds times:

- inotify: a writer thread overwrites the file with one pwrite(2) while a
  reader thread re-reads its last page in a loop and polls the inotify fd
  (IN_MODIFY). Counted: rounds where the reader saw the NEW bytes before
  the event was readable (the window a batch could be read, published and
  taken with new bytes, if nothing else guarded it), and the delay from
  pwrite's return to the event being readable.
- inotify, mmap: the writer changes the file through a shared mapping and
  msyncs it: rounds with no event at all.
- lease: the file under a read lease (F_SETLEASE F_RDLCK, signalled with
  SIGRTMIN+1); the writer's open(O_WRONLY) is timed: it returns only once
  the holder releases the lease (here, at once from the signal handler, as
  feedd's main loop does after failing the feed). Counted: rounds where the
  reader saw new bytes before the break was signalled (none can: the open
  is held).
- lease on a file the process does not own (when run as non-root on a
  root-owned file): the error F_SETLEASE gives.

Usage: bench/watch/run.py [--size MiB] [--rounds N] [--dir DIR] [--json out.json]
"""

import argparse
import ctypes
import fcntl
import json
import mmap
import os
import select
import signal
import struct
import tempfile
import threading
import time

F_SETLEASE, F_GETLEASE, F_SETSIG = 1024, 1025, 10
IN_MODIFY, IN_NONBLOCK, IN_CLOEXEC = 0x2, 0o4000, 0o2000000
libc = ctypes.CDLL(None, use_errno=True)


def inotify_watch(path):
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    assert fd >= 0
    assert libc.inotify_add_watch(fd, path.encode(), IN_MODIFY) >= 0
    return fd


def drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else None


def run_inotify(path, size, rounds):
    ifd = inotify_watch(path)
    page = 4096
    early, delays = 0, []
    for r in range(rounds):
        drain(ifd)
        new = bytes([(r + 1) % 256]) * size
        seen_new_first = [False]
        done = threading.Event()
        t_ret = [0.0]

        def reader():
            rfd = os.open(path, os.O_RDONLY)
            while not done.is_set():
                b = os.pread(rfd, page, size - page)
                ev = select.select([ifd], [], [], 0)[0]
                if b[:1] == new[:1] and not ev:
                    seen_new_first[0] = True
                if ev:
                    break
            os.close(rfd)

        th = threading.Thread(target=reader)
        th.start()
        wfd = os.open(path, os.O_WRONLY)
        os.pwrite(wfd, new, 0)
        t_ret[0] = time.perf_counter()
        select.select([ifd], [], [], 5)
        delays.append(time.perf_counter() - t_ret[0])
        os.close(wfd)
        done.set()
        th.join()
        early += seen_new_first[0]
    # Through a shared mapping: no IN_MODIFY at all.
    drain(ifd)
    missed = 0
    for r in range(min(rounds, 20)):
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, size)
        m[0:4096] = bytes([r % 256]) * 4096
        m.flush()
        m.close()
        os.close(fd)
        missed += not select.select([ifd], [], [], 0.05)[0]
        drain(ifd)
    os.close(ifd)
    return {"rounds": rounds, "new_bytes_read_before_event": early,
            "event_after_write_us_p50": pct(delays, 50) * 1e6, "event_after_write_us_p99": pct(delays, 99) * 1e6,
            "mmap_writes": min(rounds, 20), "mmap_writes_without_event": missed}


def run_lease(path, size, rounds):
    sig = signal.SIGRTMIN + 1
    holder = {"fd": -1, "broken_at": 0.0}

    def take():
        fd = os.open(path, os.O_RDONLY)
        fcntl.fcntl(fd, F_SETSIG, sig)
        fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
        holder["fd"] = fd

    def on_break(signum, frame):
        holder["broken_at"] = time.perf_counter()
        fcntl.fcntl(holder["fd"], F_SETLEASE, fcntl.F_UNLCK)

    old = signal.signal(sig, on_break)
    opens, early = [], 0
    try:
        for r in range(rounds):
            take()
            seen = [False]
            stop = threading.Event()

            def reader():
                rfd = os.open(path, os.O_RDONLY)
                marker = bytes([(r + 7) % 256])
                while not stop.is_set():
                    if os.pread(rfd, 1, 0) == marker and not holder["broken_at"]:
                        seen[0] = True
                os.close(rfd)

            holder["broken_at"] = 0.0
            th = threading.Thread(target=reader)
            th.start()
            # A child process writes: its open blocks until the lease is released.
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                wfd = os.open(path, os.O_WRONLY)
                os.pwrite(wfd, bytes([(r + 7) % 256]) * size, 0)
                os._exit(0)
            while not holder["broken_at"]:
                time.sleep(0.0001)
            os.waitpid(pid, 0)
            opens.append(holder["broken_at"] - t0)
            stop.set()
            th.join()
            early += seen[0]
            os.close(holder["fd"])
    finally:
        signal.signal(sig, old)
    out = {"rounds": rounds, "new_bytes_read_before_break": early,
           "break_signal_after_fork_us_p50": pct(opens, 50) * 1e6}
    # Not the owner, no CAP_LEASE: refused.
    if os.geteuid() != 0 and os.path.exists("/etc/hostname"):
        fd = os.open("/etc/hostname", os.O_RDONLY)
        try:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
            out["lease_on_a_file_of_root"] = "granted"
        except OSError as e:
            out["lease_on_a_file_of_root"] = os.strerror(e.errno)
        os.close(fd)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=64, help="MiB written in one pwrite")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json")
    a = ap.parse_args()
    size = a.size << 20
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        path = os.path.join(d, "shard.bin")
        with open(path, "wb") as f:
            f.write(b"\0" * size)
        res = {"size_mib": a.size, "inotify": run_inotify(path, size, a.rounds),
               "lease": run_lease(path, size, a.rounds)}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
