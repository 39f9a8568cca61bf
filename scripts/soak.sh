#!/bin/sh
# SPDX-License-Identifier: MIT
# Soak: 8 clients against one feedd for a while, with the daemon's RSS and
# open fd count sampled every second; both must stay flat.
#   scripts/soak.sh [SECONDS]        default 600 (10 minutes); CI runs 60
# Uses the build in $FEEDD_BUILD_DIR (default build). Each client slot runs
# stream-client for a random number of batches, then a new one resumes from
# the cursor its predecessor printed, so attach, detach and ring set-up and
# tear-down happen all the time; one slot in four is SIGKILLed instead of
# finishing. Every resumed stream must continue at the next batch index.
# Pass criteria, after a warm-up of a fifth of the run (at least 5 s):
#  - RSS: the median of the last quarter of samples is at most 4 MiB + 5 %
#    above the median of the first quarter;
#  - fds: with every client gone at the end, feedd holds exactly the fds it
#    held before the first client; during the run never more than 8 clients'
#    worth above that.
# Prints the samples' summary; exit 0 pass, 1 fail. With SOAK_JSON=FILE, also
# writes one meson-testlog-style JSON line there (scripts/test.sh counts it).
set -eu
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${1:-600}
BUILD=${FEEDD_BUILD_DIR:-build}
exec /usr/bin/python3 - "$SECONDS_TOTAL" "$BUILD" "${SOAK_JSON:-}" <<'PY'
import json, os, random, signal, socket, statistics, subprocess, sys, tempfile, time
from pathlib import Path

total, build, json_out = float(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3]
src = Path.cwd()
sys.path.insert(0, str(src / "scripts"))
import gen_megatron  # noqa: E402

FEEDD = build / "daemon" / "feedd"
CLIENT = build / "tests" / "integration" / "stream-client"
N_CLIENTS, WORLD = 8, 8
rng = random.Random(1)
t_start = time.time()


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def finish(ok, message):
    print(f"soak: {'PASS' if ok else 'FAIL'}: {message}")
    if json_out:
        with open(json_out, "w") as f:
            f.write(json.dumps({"name": "soak", "result": "OK" if ok else "FAIL",
                                "duration": time.time() - t_start, "stdout": message}) + "\n")
    sys.exit(0 if ok else 1)


with tempfile.TemporaryDirectory(prefix="feedd-soak-") as tmp:
    tmp = Path(tmp)
    gen_megatron.main([str(tmp / "data"), "--shards", "8", "--docs-per-shard", "400", "--mean-len", "800",
                       "--seed", "11"])
    conf = tmp / "feedd.conf"
    conf.write_text(f"[feed.web]\nshards = {tmp}/data/shard_*.idx\nseq_len = 1024\nbatch_size = 4\neos = 0\n")
    sock = str(tmp / "feedd.sock")
    log = open(tmp / "feedd.log", "w")
    daemon = subprocess.Popen([str(FEEDD), "-c", str(conf), "-s", sock], stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            break
        except OSError:
            time.sleep(0.02)
    time.sleep(0.3)
    base_fds = n_fds(daemon.pid)

    slots = [None] * N_CLIENTS  # (proc, killed?)
    cursors = [None] * N_CLIENTS
    next_index = [0] * N_CLIENTS
    samples = []  # (t, rss KiB, fds)
    problems = []
    batches = sessions = 0

    def start(i):
        n = rng.randint(20, 400)
        p = subprocess.Popen([str(CLIENT), sock, "web", str(i), str(WORLD), str(n), cursors[i] or "-",
                              str(rng.choice([0, 0, 1, 5]))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        slots[i] = (p, rng.random() < 0.25, time.time() + rng.uniform(0.05, 2.0))

    def reap(i):
        global batches
        p, _, _ = slots[i]
        out, err = p.communicate()
        got = [l.split() for l in out.splitlines() if l.startswith("batch ")]
        if p.returncode not in (0, -signal.SIGKILL):
            problems.append(f"client rank {i} exited with {p.returncode}: {err.strip()[-200:]}")
        if got:
            if int(got[0][1]) != next_index[i]:
                problems.append(f"rank {i} resumed at batch {got[0][1]}, expected {next_index[i]}")
            next_index[i] = int(got[-1][1]) + 1
            cursors[i] = got[-1][4]
            batches += len(got)
        slots[i] = None

    deadline = t_start + total
    last_sample = 0.0
    while time.time() < deadline and not problems:
        now = time.time()
        for i in range(N_CLIENTS):
            if slots[i] is None:
                start(i)
                sessions += 1
                continue
            p, kill, kill_at = slots[i]
            if kill and now >= kill_at and p.poll() is None:
                p.kill()
            if p.poll() is not None:
                reap(i)
        if now - last_sample >= 1.0:
            if daemon.poll() is not None:
                problems.append(f"feedd exited with {daemon.returncode}")
                break
            samples.append((now - t_start, rss_kib(daemon.pid), n_fds(daemon.pid)))
            last_sample = now
        time.sleep(0.01)
    for i in range(N_CLIENTS):
        if slots[i] is not None:
            slots[i][0].kill()
            reap(i)
    time.sleep(0.5)
    end_fds = n_fds(daemon.pid) if daemon.poll() is None else -1
    for _ in range(50):
        if end_fds == base_fds:
            break
        time.sleep(0.1)
        end_fds = n_fds(daemon.pid)
    daemon.send_signal(signal.SIGTERM)
    try:
        rc = daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        rc = "hung on SIGTERM"

    warm = max(5.0, total / 5)
    steady = [s for s in samples if s[0] >= warm]
    if len(steady) < 8:
        finish(False, f"only {len(steady)} samples after the warm-up; run longer")
    q = max(2, len(steady) // 4)
    first, last = statistics.median(s[1] for s in steady[:q]), statistics.median(s[1] for s in steady[-q:])
    max_fds = max(s[2] for s in samples)
    summary = (f"{total:.0f} s, {sessions} client sessions, {batches} batches; RSS {first / 1024:.1f} -> "
               f"{last / 1024:.1f} MiB (median of first/last quarter after {warm:.0f} s warm-up; min "
               f"{min(s[1] for s in steady) / 1024:.1f}, max {max(s[1] for s in steady) / 1024:.1f}); fds "
               f"{base_fds} before, max {max_fds} during, {end_fds} after; feedd exit {rc}")
    if rc != 0:
        problems.append(f"feedd exit status {rc} on SIGTERM")
    if last > first * 1.05 + 4096:
        problems.append("RSS grew")
    if end_fds != base_fds:
        problems.append("fds leaked")
    if max_fds > base_fds + N_CLIENTS * 8:
        problems.append("too many fds during the run")
    finish(not problems, summary + ("; " + "; ".join(problems) if problems else ""))
PY
