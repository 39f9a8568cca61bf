#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A root feedd on a shared node under load (issue 18): trainers of several
users attach, stream and leave, while one more user floods the control
socket with connections that never say HELLO. Printed:

- the trainers' throughput (batches/s, all of them together) with the flood
  and without it, and the ratio against the unloaded run of the same
  invocation (the issue asks for >= 0.90);
- root's `feedctl status` latency and feedd's own STATUS round trip, p50,
  p99 and max, sampled all along (< 100 ms);
- the CPU of feedd, of the trainers and of the flooder, so that what the
  flooder takes from a small machine is told from what feedd loses;
- feedd's RSS and open fds at the start and after every client left.

The trainers are threads of bench/lt-client, one process per user (setpriv),
each thread a libfeed client that reads --batches batches with a simulated
--step-ms step and leaves, then attaches again, for --seconds. The flood is
bench/lt-client flood: one process of one more uid connects as fast as
connect() returns, retries at once when refused, holds its last 200
connections. The burner phase is the control: no flood, a process spinning
the flooder's CPU. --flood-nice N adds a phase with the flooder at nice N.

Each of those runs in every --layouts, with a feedd of its own:

- unit: the CPU cgroups of a node that runs the packaged unit
  (packaging/feedd.service.in): feedd in "system.slice/feedd.service" with
  the unit's CPUWeight= (and Nice=, if it sets one), each user's trainers in
  "user.slice/user-UID.slice", the flooder (and the burner) in its own, and
  this process, the operator's shell with its feedctl and STATUS prober, in
  "user-0.slice". cgroup v2 where its root has the cpu controller, else v1's
  cpu hierarchy; skipped with a message where neither is writable. The
  groups are made in one group, feedd-lt-TAG, at this machine's cgroup
  root, weighted 8 times an ordinary thread (the work of other users of a
  shared test machine then weighs against the node what it weighs against
  the single layout's thousand threads), and removed at the end.
- single: everything in the cgroup this process is in, as every run before
  the layouts (no node runs it so: it makes feedd one thread among the
  clients' 1,000).

Needs root to make the users (useradd feedd-lt-*, removed at the end) and
the cgroups. Without root every client runs as the caller, and the output
says so.

Usage: bench/loadtest/run.py [--build DIR] [--small] [--seconds S] [--uids N] [--per-uid N] [--layouts unit,single]
                             [--flood-nice N] [--no-burner] [--json FILE]
"""

import argparse
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

def make_users(n):
    tag = secrets.token_hex(3)
    made = []
    for i in range(n):
        name = f"feedd-lt-{tag}-{i}"
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)
        made.append(pwd.getpwnam(name))
    return made


def as_user(u):
    return ["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups"] if u else []


def unit_cpu_settings():
    """CPUWeight= and Nice= of the packaged unit (systemd's defaults, 100 and 0, where it sets none)."""
    text = (common.SRC / "packaging" / "feedd.service.in").read_text()
    weight = re.search(r"^CPUWeight=(\d+)", text, re.M)
    nice = re.search(r"^Nice=(-?\d+)", text, re.M)
    return int(weight.group(1)) if weight else 100, int(nice.group(1)) if nice else 0


class Single:
    """Everything where this process runs: the layout of every run before the unit's."""

    name = "single"

    def setup(self, n_users):
        return None

    def cmd(self, argv, user):
        return argv

    def place_daemon(self, pid):
        pass

    def enter_operator(self):
        pass

    def remove(self):
        pass


class UnitLayout:
    """The unit's CPU cgroups (see the module's text): made under this machine's cgroup root, beside its own
    groups, as system.slice and user.slice are on a node."""

    name = "unit"

    def __init__(self, weight, tag):
        self.weight, self.tag = weight, tag
        self.made, self.root, self.v2 = [], None, False

    def setup(self, n_users):
        """Makes the groups; returns None, or why this machine cannot have them."""
        for root, v2 in (("/sys/fs/cgroup", True), ("/sys/fs/cgroup/unified", True), ("/sys/fs/cgroup/cpu", False),
                         ("/sys/fs/cgroup/cpu,cpuacct", False)):
            ctl = Path(root) / ("cgroup.controllers" if v2 else "cpu.shares")
            if ctl.exists() and (not v2 or "cpu" in ctl.read_text().split()):
                self.root, self.v2 = Path(root), v2
                break
        else:
            return "no cgroup with the cpu controller (v2 root with cpu, or v1 cpu hierarchy)"
        try:
            if self.v2:
                (self.root / "cgroup.subtree_control").write_text("+cpu")
            # The node's root: one group, weighted as 8 ordinary threads' worth against the other work on this
            # (shared) machine, which the single layout's thousand threads outweighed as a node's own work would.
            top = self.group(f"feedd-lt-{self.tag}", 800, parent=True)
            system = self.group(f"{top}/system.slice", 100, parent=True)
            self.group(f"{system}/feedd.service", self.weight)
            user = self.group(f"{top}/user.slice", 100, parent=True)
            for u in ["0"] + [str(i) for i in range(1, n_users + 1)]:
                self.group(f"{user}/user-{u}.slice", 100)
        except OSError as e:
            self.remove()
            return f"cannot make cgroups under {self.root}: {e}"
        return None

    def group(self, rel, weight, parent=False):
        path = self.root / rel
        path.mkdir()
        self.made.append(path)
        if self.v2:
            (path / "cpu.weight").write_text(str(weight))
            if parent:
                (path / "cgroup.subtree_control").write_text("+cpu")
        else:
            (path / "cpu.shares").write_text(str(weight * 1024 // 100))  # systemd's mapping: weight 100 = 1024
        return rel

    def procs(self, which):
        rel = f"feedd-lt-{self.tag}/system.slice/feedd.service" if which == "feedd" else \
            f"feedd-lt-{self.tag}/user.slice/user-{which}.slice"
        return str(self.root / rel / "cgroup.procs")

    def cmd(self, argv, user):
        """argv, started in user-`user`.slice (1..n: the users, in order; the flooder is the last)."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs(user)] + argv

    def place_daemon(self, pid):
        Path(self.procs("feedd")).write_text(str(pid))  # the process: every thread it has, and those it makes

    def enter_operator(self):
        Path(self.procs("0")).write_text(str(os.getpid()))

    def remove(self):
        op = Path(self.procs("0")) if self.root else None
        if op and op.exists() and str(os.getpid()) in op.read_text().split():
            (self.root / "cgroup.procs").write_text(str(os.getpid()))
        for path in reversed(self.made):
            for _ in range(50):  # a child that just exited may still be counted for a moment
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        self.made = []


def operator_socket(sock):
    """The operator socket feedd binds beside `sock` (proto/wire.h, wire_operator_socket_path)."""
    return sock[:-5] + "-operator.sock" if sock.endswith(".sock") else sock + "-operator"


def raw_status_ms(sock, flags):
    """One STATUS round trip over the protocol itself (docs/protocol.md), without starting a process: feedd's
    own latency, for the request `flags` (feedctl status's by default). Returns milliseconds, or inf when
    refused."""
    t0 = time.monotonic()
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)  # blocking, as libfeed's: waits for room in the backlog (a timeout would make it EAGAIN)
        s.settimeout(5)
        s.sendall(struct.pack("<IHHII", 0x57444546, 1, 1, 40, 0) + struct.pack("<HHI32s", 1, 1, os.getpid(), b"lt"))
        s.sendall(struct.pack("<IHHII", 0x57444546, 1, 6, 8, 0) + struct.pack("<II", flags, 0))
        def exact(n):
            buf = b""
            while len(buf) < n:
                got = s.recv(min(n - len(buf), 1 << 20))
                if not got:
                    raise OSError("closed")
                buf += got
            return buf
        for want in (2, 7):  # HELLO_REPLY, STATUS_REPLY
            _, _, typ, length, _ = struct.unpack("<IHHII", exact(16))
            exact(length)
            if typ != want:
                return float("inf")
        s.close()
    except OSError:
        return float("inf")
    return (time.monotonic() - t0) * 1000


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def run_child(p):
    """stdout of a finished child and its own CPU seconds (rusage, as wait4 gives it)."""
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return out, ru.ru_utime + ru.ru_stime


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def phase(build, sock, daemon, users, flood_user, a, layout, flood_nice=0, burn_pct=0):
    """One run: the trainers, with the flood when flood_user is not False. Returns its figures."""
    client = str(Path(build) / "bench/lt-client")
    lat, raw, ctl, stop = [], [], [], threading.Event()

    def sample():
        while not stop.is_set():
            t0 = time.monotonic()
            p = subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "--socket", sock, "status"],
                               capture_output=True, text=True)
            lat.append((time.monotonic() - t0) * 1000 if p.returncode == 0 else float("inf"))
            # feedd's share of it, through the socket feedctl used; and the same request as a client would send it.
            op = operator_socket(sock)
            raw.append(raw_status_ms(op if os.path.exists(op) else sock, a.raw_flags))
            ctl.append(raw_status_ms(sock, a.raw_flags))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample)
    drivers = [subprocess.Popen(layout.cmd(as_user(u) + [client, "trainers", sock, "web", str(a.per_uid),
                                                         str(a.seconds), str(a.batches), str(a.step_ms)], i + 1),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, u in enumerate(users)]
    flood = None
    flooder_slice = len(users) + 1  # the flooding uid's slice: the burner, its CPU without its connections, too
    if burn_pct:
        flood = subprocess.Popen(layout.cmd([client, "burn", str(a.seconds), f"{burn_pct:.0f}"], flooder_slice),
                                 stdout=subprocess.PIPE, text=True)
    elif flood_user is not False:
        nice = ["nice", "-n", str(flood_nice)] if flood_nice else []
        flood = subprocess.Popen(layout.cmd(nice + as_user(flood_user) + [client, "flood", sock, str(a.seconds), "200"],
                                            flooder_slice), stdout=subprocess.PIPE, text=True)
    t0, cpu0 = time.monotonic(), common.proc_cpu(daemon.pid)
    sampler.start()
    got = failed = attaches = 0
    clients_cpu = 0.0
    whys = []
    for d in drivers:
        out, cpu = run_child(d)
        whys += d.stderr.read().splitlines()
        g, f, n = map(int, out.split())
        got, failed, attaches, clients_cpu = got + g, failed + f, attaches + n, clients_cpu + cpu
    wall = time.monotonic() - t0
    daemon_cpu = common.proc_cpu(daemon.pid) - cpu0
    stop.set()
    sampler.join()
    flood_out, flood_cpu = run_child(flood) if flood else (None, 0.0)
    fin = [x for x in lat if x != float("inf")]
    rfin = [x for x in raw if x != float("inf")]
    return {"batches_per_s": got / wall, "daemon_cpu_pct": 100 * daemon_cpu / wall, "failed": failed,
            "attaches": attaches, "wall_s": wall, "clients_cpu_pct": 100 * clients_cpu / wall,
            "flood_cpu_pct": 100 * flood_cpu / wall,
            "status_p50_ms": statistics.median(lat) if lat else None, "status_p99_ms": pct(lat, 0.99),
            "status_max_ms": max(lat) if lat else None, "status_refused": len(lat) - len(fin),
            "status_samples": len(lat), "raw_p50_ms": statistics.median(raw) if raw else None,
            "raw_p99_ms": pct(raw, 0.99), "raw_max_ms": max(raw) if raw else None,
            "raw_over_100": sum(x >= 100 for x in raw), "raw_refused": len(raw) - len(rfin),
            "status_over_100": sum(x >= 100 for x in lat), "load_avg": os.getloadavg()[0],
            "ctl_p50_ms": statistics.median(ctl) if ctl else None, "ctl_p99_ms": pct(ctl, 0.99),
            "ctl_max_ms": max(ctl) if ctl else None,
            "flood": flood_out.split() if flood_out and not burn_pct else None, "flood_nice": flood_nice,
            "failures": whys}


def run_layout(a, layout, users, data, tmp, nice):
    """Every phase in one layout, with a feedd of its own. Returns (runs, start, end) or None when skipped."""
    root = os.geteuid() == 0
    why = layout.setup(a.uids + 1)
    if why:
        print(f"# layout {layout.name}: skipped: {why}", flush=True)
        return None
    runs = []
    try:
        layout.enter_operator()  # this process: root's shell, its feedctl and the STATUS prober
        # Each user may hold its clients (feedd's default per uid is 64); the flood user gets as many.
        conf = (f"[feedd]\nsocket_mode = 0666\nmax_connections_per_uid = {max(64, a.per_uid + 8)}\n"
                f"max_connections = {max(1024, (a.uids + 1) * (a.per_uid + 8))}\n[feed.web]\nshards = {data}/shard_*.idx\nseq_len = 1024\n"
                f"batch_size = 4\nseed = 7\nshuffle = true\nshuffle_window = 2\nbos = none\neos = none\n")
        daemon, sock = common.start_feedd(a.build, conf, tmp, name=f"feedd-{layout.name}")
        try:
            layout.place_daemon(daemon.pid)
            time.sleep(1)
            tasks = os.listdir(f"/proc/{daemon.pid}/task")  # every thread feedd has started by now (workers, loader)
            if nice:  # Nice= is per thread on Linux: each of them, as systemd's setpriority before exec gives all
                for t in tasks:
                    os.setpriority(os.PRIO_PROCESS, int(t), nice)
            if a.rt:
                for t in tasks:
                    subprocess.run(["chrt", "-f", "-p", "10", t], check=True, capture_output=True)
                os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(10))  # children: ordinary
            start = {"rss_mib": common.proc_mem(daemon.pid)["VmRSS"], "fds": fds(daemon.pid),
                     "load_avg": os.getloadavg()[0]}
            trainers = users[:a.uids] if root else [None] * a.uids
            flooder = users[a.uids] if root else None
            common.progress(f"loadtest ({layout.name}): unloaded phase")
            runs.append(("unloaded (peer)", phase(a.build, sock, daemon, trainers, False, a, layout)))
            common.progress(f"loadtest ({layout.name}): phase with the flood")
            runs.append(("with a flooding uid", phase(a.build, sock, daemon, trainers, flooder, a, layout)))
            if not a.no_burner:
                # The control: no flood, a process that only spins as much CPU as the flooder took.
                burn = min(100.0, runs[-1][1]["flood_cpu_pct"])
                common.progress(f"loadtest ({layout.name}): phase with a CPU burner of {burn:.0f} % instead of the flood")
                runs.append((f"burner {burn:.0f}%, no flood",
                             phase(a.build, sock, daemon, trainers, False, a, layout, burn_pct=burn)))
            if a.flood_nice:
                common.progress(f"loadtest ({layout.name}): phase with the flood at nice {a.flood_nice}")
                runs.append((f"flood, flooder nice {a.flood_nice}",
                             phase(a.build, sock, daemon, trainers, flooder, a, layout, a.flood_nice)))
            time.sleep(7)  # past handshake_timeout_s: the flood's last connections closed, a trim done
            end = {"rss_mib": common.proc_mem(daemon.pid)["VmRSS"], "fds": fds(daemon.pid)}
        finally:
            if a.rt:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            common.stop(daemon)
    finally:
        layout.remove()
    return runs, start, end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.SRC / "build"))
    ap.add_argument("--small", action="store_true", help="4 users x 16 clients, 20 s a phase (a quick look)")
    ap.add_argument("--seconds", type=float, help="a phase's length (60; --small: 20)")
    ap.add_argument("--uids", type=int, help="users with trainers (8; --small: 4)")
    ap.add_argument("--per-uid", type=int, help="clients each keeps attached (125; --small: 16)")
    ap.add_argument("--batches", type=int, default=20, help="batches each client reads before it leaves")
    ap.add_argument("--step-ms", type=int, default=20, help="simulated training step between batches")
    ap.add_argument("--layouts", default="unit,single",
                    help="comma-separated: unit (the packaged unit's CPU cgroups), single (everything in one group)")
    ap.add_argument("--flood-nice", type=int, default=0,
                    help="a last phase with the flooding process at this nice level (0: none): in the single "
                         "layout, on a 2-core VM, the flooder's own CPU (a core) is taken from the trainers and "
                         "feedd, which a many-core node would not notice")
    ap.add_argument("--no-burner", action="store_true", help="leave out the burner phase (the flood's control)")
    ap.add_argument("--raw-flags", type=lambda x: int(x, 0), default=3,
                    help="the prober's STATUS flags (docs/protocol.md; default 3, what feedctl status asks; "
                         "0: the whole document)")
    ap.add_argument("--rt", action="store_true",
                    help="run feedd's threads and the STATUS prober at SCHED_FIFO 10 (root): on a small VM the "
                         "clients' 1,000 threads then cannot delay them, so the figures are feedd's own latency")
    ap.add_argument("--json")
    a = ap.parse_args()
    for k, full, small in (("seconds", 60, 20), ("uids", 8, 4), ("per_uid", 125, 16)):
        if getattr(a, k) is None:
            setattr(a, k, small if a.small else full)
    weight, nice = unit_cpu_settings()
    root = os.geteuid() == 0
    load0, mline = os.getloadavg()[0], common.machine()  # before this run's own load counts in it
    users = make_users(a.uids + 1) if root else []
    tmp = Path(tempfile.mkdtemp(prefix="feedd-loadtest-"))
    os.chmod(tmp, 0o755)
    results = []
    try:
        data = tmp / "data"
        common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                                  "--seed", "3"])
        os.chmod(data, 0o755)
        for name in a.layouts.split(","):
            layout = UnitLayout(weight, secrets.token_hex(3)) if name == "unit" else Single()
            got = run_layout(a, layout, users, data, tmp, nice if name == "unit" else 0)
            if got:
                results.append((name, *got))
    finally:
        for u in users:
            subprocess.run(["userdel", "--force", u.pw_name], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    scale = (f"{a.uids} users x {a.per_uid} clients, {a.seconds:g} s a phase"
             + (", scaled down (--small), not the issue's 8 x 125 for 60 s" if (a.uids, a.per_uid, a.seconds) != (8, 125, 60) else ""))
    print(f"# loadtest: {mline}; {common.date()}; {scale}")
    print(f"# each client (a thread of bench/lt-client, one process per user) reads {a.batches} batches of 4 x 1024 "
          f"tokens with a {a.step_ms} ms step, then leaves and attaches again"
          + ("" if root else "; NOT root: every client runs as the caller's uid"))
    print("# the flood: one process of one more uid connects as fast as connect() returns, retries at once when "
          "refused, holds its last 200 connections and never says HELLO")
    print(f"# layouts: unit = feedd in system.slice/feedd.service (CPUWeight={weight}, Nice={nice}: the packaged "
          "unit's), each uid's clients in user.slice/user-UID.slice, the flooder and the burner in their own, "
          "feedctl and the prober in user-0.slice, all in one group weighted 8 threads' worth against the rest of "
          "this machine; single = everything in one cgroup, as before")
    if a.rt:
        print("# --rt: feedd's threads and the STATUS prober at SCHED_FIFO 10; feedctl and the clients are not")
    if not a.no_burner:
        print("# burner: the control, no flood but a process spinning as much CPU as the flooder used (its share of "
              "the VM); the flood's cost to feedd is the gap between the two rows")
    print(f"# status: `feedctl status` wall time (a process start included); one STATUS round trip (connect, HELLO, "
          f"STATUS with flags {a.raw_flags}) over the operator socket feedctl uses (feedd's own latency); the same over "
          "the control socket, where a connection queues behind the clients' in the accept backlog; p50 / p99 / max, "
          "sampled every 0.25 s; >=100: feedctl samples of 100 ms or more; CPU in % of one core")
    print(f"{'layout':<7} {'run':<26} {'batches/s':>9} {'ratio':>6} {'attaches':>8} {'failed':>6} "
          f"{'feedctl p50/p99/max ms':>23} {'STATUS p50/p99/max ms':>22} {'control p50/p99/max ms':>23} {'>=100':>7} "
          f"{'feedd':>6} {'clients':>7} "
          f"{'flooder':>7} {'load':>5}")
    for lname, runs, start, end in results:
        peer = runs[0][1]["batches_per_s"]
        for name, r in runs:
            print(f"{lname:<7} {name:<26} {r['batches_per_s']:>9.1f} {r['batches_per_s'] / peer:>6.3f} "
                  f"{r['attaches']:>8} {r['failed']:>6} "
                  f"{r['status_p50_ms']:>7.1f}/{r['status_p99_ms']:>6.1f}/{r['status_max_ms']:>7.1f} "
                  f"{r['raw_p50_ms']:>7.1f}/{r['raw_p99_ms']:>6.1f}/{r['raw_max_ms']:>6.1f} "
                  f"{r['ctl_p50_ms']:>7.1f}/{r['ctl_p99_ms']:>6.1f}/{r['ctl_max_ms']:>7.1f} "
                  f"{r['status_over_100']:>3}/{r['status_samples']:<3}{r['daemon_cpu_pct']:>5.0f}% "
                  f"{r['clients_cpu_pct']:>6.0f}% {r['flood_cpu_pct']:>6.0f}% {r['load_avg']:>5.1f}")
            if r["flood"]:
                print(f"{'':<34} flood: {r['flood'][0]} connections opened, {r['flood'][1]} refused")
            for why in sorted(set(w.split(": ", 1)[1] if ": " in w else w for w in r["failures"]))[:3]:
                print(f"{'':<34} failed: {why[:150]}")
        print(f"{lname:<7} feedd RSS {start['rss_mib']:.1f} MiB -> {end['rss_mib']:.1f} MiB after; open fds "
              f"{start['fds']} -> {end['fds']}; load average {start['load_avg']:.1f} at its start")
    print(f"# load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if a.json:
        Path(a.json).write_text(json.dumps({"scale": scale, "unit_cpu_weight": weight, "unit_nice": nice,
                                            "layouts": [{"layout": l, "start": st, "end": en, "runs": r}
                                                        for l, r, st, en in results]}, indent=1))


if __name__ == "__main__":
    main()
