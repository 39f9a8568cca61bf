#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What a feedd restart costs a trainer (issue 17): the stall, daemon exit to
the first batch after it, p50 and p99 over --restarts restarts.

Three trainers, each a Python process reading batches back to back
(feed.Loader, as_numpy) and printing each batch's CLOCK_MONOTONIC arrival:

- reconnect: one process for the whole run; libfeed reconnects on its own
  (reconnect_timeout) and the Loader goes on. feedd binds its socket
  itself: while it is down, connecting fails and libfeed backs off.
- reconnect (C): tests/integration/stream-client, a C trainer through
  libfeed with nothing set (libfeed's default reconnect_timeout, 300 s),
  each batch's arrival taken when its line is read (line-buffered);
- reconnect, socket kept: the same, with the listening socket made once by
  the bench and passed to every feedd ($LISTEN_FDS), as systemd's
  feedd.socket does across `systemctl restart`: connecting never fails, the
  connection waits in the socket's backlog until the new daemon serves it.
- peer (what users do today): the Loader raises when feedd dies; the trainer
  process is started again (it imports torch, as a trainer does) and resumes
  from the cursor of its last batch (its checkpoint), retrying the attach
  with the same backoff as libfeed (5 ms doubling to 250 ms) while the
  daemon is not up.

Each restart: at a random point, SIGSTOP feedd (the trainer takes what the
ring holds), then SIGKILL it and start it again at once (as systemd's
Restart= does, minus RestartSec), and measure from the moment the old
daemon's exit is seen to the first batch after it. The daemon's own
start-up time is in all three.

Then, as many restarts again with the socket kept, where the stall goes
(what systemd's fd store could shorten, docs/operations.md): a probe
process waits for each restart and, from the moment the old daemon's exit
is seen, connects (the HELLO is answered once the new daemon serves:
its start-up), attaches (the new daemon makes the ring and its memfds, the
client maps and checks them: all an fd store handing the rings to the next
daemon could save, and an upper bound of it) and takes the first batch (the
new daemon reads and packs it).

Usage: bench/restart/run.py [--build DIR] [--restarts N] [--json out.json]
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

WORKER = r"""
import sys, time
mode, sock, cursor = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
if mode == "peer":
    import torch  # noqa: F401  (a trainer's start-up)
import feed
backoff = 0.005
while True:  # the checkpoint's cursor, attached as soon as feedd takes it
    try:
        loader = feed.Loader("web", socket=sock, as_numpy=True, timeout=60,
                             reconnect_timeout=(300 if mode == "reconnect" else 0))
        if cursor:
            loader.load_state_dict({**loader.state_dict(), "cursor": cursor})
        break
    except feed.DaemonGoneError:
        time.sleep(backoff)
        backoff = min(backoff * 2, 0.25)
try:
    for b in loader:
        print(f"batch {b.index} {time.monotonic():.6f} {b.cursor}", flush=True)
        del b
except feed.DaemonGoneError:
    sys.exit(3)
"""


PROBE = r"""
import ctypes, sys, time
from feed import _lib
lib, sock = _lib.lib, sys.argv[1].encode()
print("ready", flush=True)
for line in sys.stdin:
    t0 = time.monotonic()
    c = ctypes.c_void_p()
    r = lib.feed_client_connect(sock, ctypes.byref(c))
    t1 = time.monotonic()
    r = r or lib.feed_client_attach(c, b"web", 0, 1, None)
    t2 = time.monotonic()
    b = _lib.feed_batch()
    r = r or lib.feed_client_next(c, 60000, ctypes.byref(b))
    t3 = time.monotonic()
    lib.feed_client_close(c)
    print(r, t0, t1, t2, t3, flush=True)
"""


def pctl(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Trainer:
    def __init__(self, build, mode, sock):
        self.mode, self.sock, self.build = mode, sock, build
        self.lines = []  # (index, t, cursor)
        self.lock = threading.Lock()
        self.stopped = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _spawn(self, cursor):
        if self.mode == "c":
            env = {k: v for k, v in os.environ.items() if k != "FEED_RECONNECT_TIMEOUT"}
            return subprocess.Popen([str(Path(self.build) / "tests/integration/stream-client"), self.sock, "web", "0",
                                     "1", "100000000", "-", "0", "0"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env=env)
        env = {**os.environ, "PYTHONPATH": str(common.SRC / "client" / "python"), "FEEDD_BUILD_DIR": str(self.build)}
        args = [sys.executable, "-c", WORKER, self.mode, self.sock] + ([cursor] if cursor else [])
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    def _run(self):
        cursor = None
        while not self.stopped:
            self.p = self._spawn(cursor)
            for line in self.p.stdout:
                if self.mode == "c":  # batch INDEX EPOCH HASH CURSOR, timed as it arrives
                    if not line.startswith("batch "):
                        continue
                    _, i, _, _, cur = line.split()
                    t = time.monotonic()
                else:
                    _, i, t, cur = line.split()
                with self.lock:
                    self.lines.append((int(i), float(t), cur))
                cursor = cur
            self.p.wait()
            if self.mode in ("reconnect", "c"):
                break

    def stop(self):
        self.stopped = True
        self.p.kill()


def start_activated(build, conf_text, tmp, lsock):
    """feedd serving a listening socket it inherits (fd 3, $LISTEN_FDS), as systemd's feedd.socket passes it."""
    conf = Path(tmp) / "activated.conf"
    conf.write_text(conf_text)

    fd = lsock.fileno()
    move = "" if fd == 3 else f"exec 3<&{fd} {fd}<&-; "  # the socket must end up as fd 3
    return subprocess.Popen(["/bin/sh", "-c", f'export LISTEN_PID=$$; {move}exec "$0" "$@"',
                             str(Path(build) / "daemon/feedd"), "-c", str(conf)],
                            env={**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "control"}, pass_fds=(fd,),
                            stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "act.log", "w"))


def measure(build, data, tmp, mode, restarts, rng):
    conf = f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = 2048\nbatch_size = 4\n"
    kept = mode == "reconnect, socket kept"
    if kept:
        sock = str(Path(tmp) / "kept.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(sock)
        lsock.listen(128)
        d = start_activated(build, conf, tmp, lsock)
        start = lambda: start_activated(build, conf, tmp, lsock)  # noqa: E731
    else:
        d, sock = common.start_feedd(build, conf, tmp, "feedd")
        start = lambda: common.start_feedd(build, conf, tmp, "feedd")[0]  # noqa: E731
    tr = Trainer(build, {"peer": "peer", "reconnect (C)": "c"}.get(mode, "reconnect"), sock)
    stalls = []
    try:
        deadline = time.monotonic() + 60
        while not tr.lines:
            assert time.monotonic() < deadline, f"{mode}: no first batch within 60 s"
            time.sleep(0.01)
        for _ in range(restarts):
            time.sleep(rng.uniform(0.3, 0.8))
            # Stopped first, so the trainer takes what the ring holds: every batch after the exit is the new daemon's.
            d.send_signal(signal.SIGSTOP)
            time.sleep(0.1)
            d.send_signal(signal.SIGKILL)
            d.wait()
            t_exit = time.monotonic()
            n0 = len(tr.lines)
            d = start()
            deadline = time.monotonic() + 120
            first = None
            while first is None and time.monotonic() < deadline:
                with tr.lock:
                    if len(tr.lines) > n0:
                        first = tr.lines[n0][1]
                time.sleep(0.002)
            assert first is not None, f"{mode}: no batch after a restart"
            stalls.append(first - t_exit)
    finally:
        tr.stop()
        d.send_signal(signal.SIGTERM)
        d.wait()
        if kept:
            lsock.close()
    idx = [i for i, _, _ in tr.lines]
    # Nothing lost, nothing repeated: the peer resumes from its cursor, the reconnecting loader goes on.
    assert idx == list(range(len(idx))), f"{mode}: batches lost or repeated"
    return stalls, len(idx)


def phases(build, data, tmp, restarts, rng):
    """Socket kept: daemon exit -> HELLO answered -> attached (ring made and mapped) -> first batch, per restart."""
    conf = f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = 2048\nbatch_size = 4\n"
    sock = str(Path(tmp) / "phases.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(sock)
    lsock.listen(128)
    env = {**os.environ, "PYTHONPATH": str(common.SRC / "client" / "python"), "FEEDD_BUILD_DIR": str(build)}
    probe = subprocess.Popen([sys.executable, "-c", PROBE, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
    assert probe.stdout.readline().strip() == "ready"
    d = start_activated(build, conf, tmp, lsock)
    out = {"start-up": [], "attach": [], "first batch": []}
    try:
        for _ in range(restarts):
            time.sleep(rng.uniform(0.3, 0.8))
            d.send_signal(signal.SIGKILL)
            d.wait()
            t_exit = time.monotonic()
            probe.stdin.write("go\n")
            probe.stdin.flush()
            d = start_activated(build, conf, tmp, lsock)
            r, t0, t1, t2, t3 = probe.stdout.readline().split()
            assert int(r) == 0, f"probe: libfeed error {r}"
            t1, t2, t3 = float(t1), float(t2), float(t3)
            out["start-up"].append(t1 - t_exit)
            out["attach"].append(t2 - t1)
            out["first batch"].append(t3 - t2)
    finally:
        probe.kill()
        d.send_signal(signal.SIGTERM)
        d.wait()
        lsock.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.SRC / "build"))
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    build = Path(a.build).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="feedd-restart-"))
    data = tmp / "data"
    common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                              "--seed", "3"])
    rng = random.Random(17)
    res = {"machine": common.machine(), "restarts": a.restarts}
    modes = ("reconnect", "reconnect (C)", "reconnect, socket kept", "peer")
    for mode in modes:
        stalls, n = measure(build, data, tmp, mode, a.restarts, rng)
        res[mode] = {"p50_ms": pctl(stalls, 0.5) * 1e3, "p99_ms": pctl(stalls, 0.99) * 1e3,
                     "max_ms": max(stalls) * 1e3, "batches": n}
    res["ratio_p50"] = res["peer"]["p50_ms"] / max(res["reconnect"]["p50_ms"], 1e-9)
    print(f"{res['machine']}\nstall per feedd restart (daemon exit -> first batch after it), "
          f"{a.restarts} SIGKILL+restart each:")
    for mode in modes:
        r = res[mode]
        print(f"  {mode:22s}  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  max {r['max_ms']:8.1f} ms  "
              f"({r['batches']} batches, none lost or repeated)")
    print(f"  the peer stalls {res['ratio_p50']:.1f}x longer at p50")
    ph = phases(build, data, tmp, a.restarts, rng)
    res["socket kept, phases"] = {k: {"p50_ms": pctl(v, 0.5) * 1e3, "p99_ms": pctl(v, 0.99) * 1e3}
                                  for k, v in ph.items()}
    total = sum(pctl(v, 0.5) for v in ph.values())
    res["fd_store_bound_share_p50"] = pctl(ph["attach"], 0.5) / total
    print(f"where a socket-kept restart's stall goes ({a.restarts} more restarts, a probe that connects, attaches "
          "and takes one batch):")
    for k, v in res["socket kept, phases"].items():
        print(f"  {k:12s}  p50 {v['p50_ms']:8.2f} ms  p99 {v['p99_ms']:8.2f} ms")
    print(f"  the attach (ring made, passed, mapped: the most systemd's fd store could save) is "
          f"{100 * res['fd_store_bound_share_p50']:.0f}% of the p50 total")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
