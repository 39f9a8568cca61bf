# SPDX-License-Identifier: MIT
"""Telemetry that explains itself (docs/telemetry.md), against a real feedd and real clients.

Each test makes a situation happen for real (a slow trainer, a feed throttled
to one thread, a client that never releases, ranks at different speeds) and
checks that feedd's own diagnosis names it, with numbers that agree with an
independent measurement.
"""

import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from conftest import BUILD, FEEDCTL, FEEDD, SRC, feed_conf, open_fds

sys.path.insert(0, str(SRC / "client" / "python"))
os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
import feed  # noqa: E402

DIAG = "[diagnosis]\nwindow_s = 6\nmin_batches = 3\n\n"


def hist_bucket(v):
    """proto/ring_abi.h feed_hist_bucket(), written again from its comment."""
    if v < 4:
        return v
    e = v.bit_length() - 1
    return 4 * (e - 1) + ((v >> (e - 2)) & 3)


def nearest_rank(values, q):
    s = sorted(values)
    k = max(1, math.ceil(q * len(s)))
    return s[k - 1]


def wait_for(d, pred, timeout=30, what="condition"):
    """Polls feedd's status until pred(status) returns something truthy; returns it."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = d.status()
        got = pred(last)
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last status:\n{json.dumps(last, indent=1)[:6000]}")


def client_of(st, rank, world=None):
    for c in st["clients"]:
        if c["rank"] == rank and (world is None or c["world"] == world):
            return c
    return None


def settled(kind_prefix=None, min_batches=5, rank=0):
    """A predicate: rank's client has a verdict (not warming up) over at least min_batches batches."""
    def pred(st):
        c = client_of(st, rank)
        if not c or not c.get("diagnosis") or c["telemetry"]["window"]["batches"] < min_batches:
            return None
        if c["diagnosis"]["kind"] in ("warming-up",):
            return None
        if kind_prefix and not c["diagnosis"]["kind"].startswith(kind_prefix):
            return None
        return c
    return pred


def stop(p):
    if p.poll() is None:
        p.kill()
    p.wait()
    for f in (p.stdout, p.stderr):
        if f:
            f.close()


def test_slow_trainer_is_compute_bound(daemon, dataset):
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx"))
    p = d.client("web", 0, 1, 100000, sleep_ms=40)
    try:
        c = wait_for(d, settled(min_batches=20), what="a verdict on the slow trainer")
        dg, w = c["diagnosis"], c["telemetry"]["window"]
        assert dg["kind"] == "compute-bound", dg
        assert dg["severity"] == 0
        m = re.fullmatch(r"compute-bound: data wait ([\d.]+) % of step time", dg["text"])
        assert m, dg["text"]
        assert abs(float(m.group(1)) - w["stall_pct"]) < 0.1
        assert w["stall_pct"] < 5
        # 40 ms sleeps: the step distribution says so (bucket midpoints are within 12.5 %).
        assert 40 * 0.85 < w["step"]["p50_ms"] < 40 * 1.6, w["step"]
        assert w["step"]["count"] >= 20
        # The ring stays full (the daemon is ahead); the client holds at most the batch it works on.
        assert w["ring_full_pct"] > 50
        assert c["telemetry"]["held"] <= 1
        # feedctl status shows the verdict in words; the worst line is this client's.
        text = d.ctl("status").stdout
        assert "compute-bound: data wait" in text, text
        assert d.status()["telemetry"]["worst"]["severity"] == 0
    finally:
        stop(p)


HOST_RE = (r"starved: waiting ([\d.]+) % — host CPUs oversubscribed: feedd's workers waited for a CPU ([\d.]+) % "
           r"of the time they could run, getting ([\d.]+) CPUs for (\d+) threads \(load average [\d.]+ on (\d+) CPUs\)")


def check_host_verdict(st, c, threads):
    """A host-bound verdict carries the figures of status's host object, and they pass host_pct."""
    dg, host = c["diagnosis"], st["telemetry"]["host"]
    m = re.match(HOST_RE, dg["text"])
    assert m, dg["text"]
    assert host["runqueue_pct"] >= st["telemetry"]["thresholds"]["host_pct"], host
    assert abs(float(m.group(2)) - host["runqueue_pct"]) <= max(0.05 * host["runqueue_pct"], 0.1), (m.group(2), host)
    assert int(m.group(4)) == threads
    assert int(m.group(5)) == host["cpus"]
    assert st["feeds"][0]["diagnosis"]["kind"] == "host-bound", st["feeds"][0]["diagnosis"]


def test_throttled_feed_is_diagnosed_feed_bound_naming_its_stage(daemon, dataset):
    # One worker thread, big batches, a client that does nothing but take them: the feed cannot keep up.
    # On a quiet host the verdict names the stage holding the worker's time; on a host so loaded that the
    # worker waits for a CPU (host_pct) it names the host instead. Either way the words must carry the
    # numbers of the daemon's own counters; a verdict of "latency" (workers idle) is wrong here, so the
    # test keeps polling through load spikes and fails if no stage or host verdict ever comes.
    B, L = 32, 16384
    d = daemon(DIAG + "[feedd]\nring_slots = 8\n\n"
               + feed_conf("big", f"{dataset}/shard_*.idx", seq_len=L, batch_size=B), threads=1)
    loader = feed.Loader("big", rank=0, world_size=1, socket=d.socket, as_numpy=True)
    t0, n = time.monotonic(), 0
    verdict, seen = None, set()
    deadline = t0 + 60
    while time.monotonic() < deadline:
        b = next(loader)
        n += 1
        del b
        if n % 20 == 0 and time.monotonic() - t0 > 4:
            st = d.status()
            c = client_of(st, 0)
            seen.add(c["diagnosis"]["text"][:120])
            if (c["diagnosis"]["kind"] == "starved" and c["diagnosis"]["cause"] != "latency"
                    and c["telemetry"]["window"]["batches"] >= 10):
                verdict = (st, c, n / (time.monotonic() - t0))
                break
    assert verdict, f"no stage or host verdict in 60 s; saw: {seen}"
    st, c, client_rate = verdict
    loader.close()
    dg = c["diagnosis"]
    f = st["feeds"][0]
    stages = f["stages"]
    assert stages["threads"] == 1
    w = c["telemetry"]["window"]
    assert w["stall_pct"] >= st["telemetry"]["thresholds"]["starved_pct"]
    # Independently: what the client saw arrive agrees with the rate the daemon says it produced.
    produced = stages["job"]["items_per_s"]
    assert produced == pytest.approx(client_rate, rel=0.35), (produced, client_rate)
    # Bytes the pack stage wrote are the batches' int32 tokens.
    assert stages["pack"]["mb_per_s"] == pytest.approx(stages["pack"]["items_per_s"] * B * L * 4 / 1e6, rel=1e-6)
    if dg["cause"] == "host":
        check_host_verdict(st, c, 1)
        return

    # The named cause is the stage where the worker spends most of its time, as the stage counters say.
    assert st["telemetry"]["pool_busy_pct"] >= st["telemetry"]["thresholds"]["busy_pct"]
    cpu = {k: stages[k]["busy_threads"] for k in ("read", "decompress", "tokenize", "pack", "h2d")}
    cpu["read"] *= 1 - stages["read"]["offcpu_pct"] / 100
    other = stages["workers"]["busy_threads"] - sum(stages[k]["busy_threads"] for k in cpu)
    expected = max(cpu, key=cpu.get) if max(cpu.values()) >= other else "job"
    if stages["read"]["offcpu_pct"] * stages["read"]["busy_threads"] >= 50 * stages["workers"]["busy_threads"]:
        expected = "storage"
    assert dg["cause"] == expected, (dg, stages)

    # The words carry the same numbers: stall, thread count, throughput, the factor needed.
    m = re.match(r"starved: waiting ([\d.]+) % — (\w[\w ]*?) busy on all 1 threads at ([\d.]+) MB/s "
                 r"\(([\d.]+) % of worker time\); needs ~([\d.]+)x more", dg["text"])
    assert m, dg["text"]
    assert abs(float(m.group(1)) - w["stall_pct"]) <= max(0.05 * w["stall_pct"], 0.1)
    mbs = stages[dg["cause"]]["mb_per_s"] if dg["cause"] != "job" else stages["job"]["mb_per_s"]
    assert abs(float(m.group(3)) - mbs) <= max(0.01, 0.01 * mbs), (m.group(3), mbs)
    needed = (w["wait_s"] + w["step_s"]) / w["step_s"]
    assert abs(float(m.group(5)) - needed) <= 0.051, (m.group(5), needed)
    assert dg["needed_x"] == pytest.approx(needed, rel=1e-6)

    # The feed's own diagnosis names the same cause.
    assert f["diagnosis"]["kind"] == f"{dg['cause']}-bound", f["diagnosis"]
    assert "rank 0/1 waits" in f["diagnosis"]["text"]


def test_oversubscribed_host_is_diagnosed_host_bound(daemon, dataset):
    """feedd's two workers and two busy loops share one CPU: the client starves, and the host is named.

    The daemon's threads are pinned to CPU 0 (sched_setaffinity per thread) and two processes spin on it
    too, so the workers can get at most a third of one CPU whatever else the machine does: their
    run-queue share is far past host_pct, and blaming a stage or storage would be wrong.
    """
    B, L = 32, 16384
    d = daemon(DIAG + "[feedd]\nring_slots = 8\n\n"
               + feed_conf("big", f"{dataset}/shard_*.idx", seq_len=L, batch_size=B), threads=2)
    for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
        os.sched_setaffinity(int(tid), {0})
    spin = "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"
    burners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    loader = feed.Loader("big", rank=0, world_size=1, socket=d.socket, as_numpy=True)
    try:
        t0, n, verdict, seen = time.monotonic(), 0, None, set()
        while time.monotonic() < t0 + 60:
            b = next(loader)
            n += 1
            del b
            if n % 5 == 0 and time.monotonic() - t0 > 4:
                st = d.status()
                c = client_of(st, 0)
                seen.add(c["diagnosis"]["text"][:120])
                if c["diagnosis"]["kind"] == "starved" and c["telemetry"]["window"]["batches"] >= 5:
                    verdict = (st, c)
                    if c["diagnosis"]["cause"] == "host":
                        break
        assert verdict, f"the client never starved; saw: {seen}"
        st, c = verdict
        assert c["diagnosis"]["cause"] == "host", (c["diagnosis"], st["telemetry"]["host"])
        check_host_verdict(st, c, 2)
        # The workers got at most the third of one CPU they share with two busy loops (and the main thread).
        assert st["telemetry"]["host"]["workers_cpu_per_s"] <= 0.5, st["telemetry"]["host"]
        assert "host CPUs oversubscribed" in st["telemetry"]["worst"]["text"]
    finally:
        loader.close()
        for p in burners:
            p.kill()
            p.wait()


def test_client_that_never_releases(daemon, dataset):
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx") + "\n[feedd]\nring_slots = 4\n")
    p = d.client("web", 0, 1, 100000, hold=True)
    try:
        assert p.stdout.readline().strip() == "attached"
        c = wait_for(d, lambda st: (client_of(st, 0) or {}).get("diagnosis", {}).get("kind") == "slow-release"
                     and client_of(st, 0), what="a slow-release verdict")
        dg = c["diagnosis"]
        m = re.fullmatch(r"client slow to release: ring full ([\d.]+) % of the time, holding (\d+) of (\d+) slots",
                         dg["text"])
        assert m, dg["text"]
        assert float(m.group(1)) >= 90
        assert (int(m.group(2)), int(m.group(3))) == (4, 4)
        assert c["telemetry"]["held"] == 4 and c["ring_fill"] == 4
        assert dg["severity"] == 2
        worst = d.status()["telemetry"]["worst"]
        assert worst["severity"] == 2 and "client slow to release" in worst["text"] and "rank 0/1" in worst["text"]
    finally:
        stop(p)


def test_percentiles_match_the_clients_own_record(daemon, dataset):
    """The client records every wait it sees; the daemon's percentiles fall in the same buckets."""
    d = daemon(feed_conf("big", f"{dataset}/shard_*.idx", seq_len=4096, batch_size=8), threads=1)
    loader = feed.Loader("big", rank=0, world_size=1, socket=d.socket, as_numpy=True)
    waits, steps = [], []
    for i in range(150):
        b = next(loader)
        s = loader.stats()
        waits.append(round(s["last_wait_s"] * 1e9))
        if i:
            steps.append(round(s["last_step_s"] * 1e9))
        del b
        # Uneven steps, so the waits spread over many buckets.
        time.sleep((i % 7) * 0.0007)
    time.sleep(1.6)  # at least one tick after the last batch, so the window has them all
    c = client_of(d.status(), 0)
    for period in ("since_attach", "window"):
        tel = c["telemetry"][period]
        assert tel["wait"]["count"] == len(waits), (period, tel["wait"])
        for q, key in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms"), (1.0, "max_ms")):
            ref = nearest_rank(waits, q)
            got = round(tel["wait"][key] * 1e6)
            assert hist_bucket(got) == hist_bucket(ref), (period, key, got, ref)
            assert abs(got - ref) <= 0.125 * ref + 1, (period, key, got, ref)
        assert tel["wait"]["mean_ms"] == pytest.approx(sum(waits) / len(waits) / 1e6, rel=1e-6)
        assert tel["step"]["count"] == len(steps)
        ref = nearest_rank(steps, 0.5)
        assert hist_bucket(round(tel["step"]["p50_ms"] * 1e6)) == hist_bucket(ref)
    loader.close()


def test_straggler_is_named(daemon, dataset):
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx"))
    ps = [d.client("web", r, 3, 100000, sleep_ms=ms) for r, ms in ((0, 10), (1, 10), (2, 60))]
    try:
        def named(st):
            cs = [client_of(st, r, 3) for r in range(3)]
            if not all(cs) or any(c["telemetry"]["window"]["batches"] < 10 for c in cs):
                return None
            return cs if cs[2]["diagnosis"]["straggler"] else None
        cs = wait_for(d, named, what="a straggler")
        assert re.match(r"straggler: a batch every [\d.]+ ms vs a median of [\d.]+ ms over its 2 peers",
                        cs[2]["diagnosis"]["straggler"])
        assert cs[2]["diagnosis"]["kind"] == "straggler"
        assert cs[0]["diagnosis"]["straggler"] is None and cs[1]["diagnosis"]["straggler"] is None
        f = d.status()["feeds"][0]["diagnosis"]
        assert [s["rank"] for s in f["stragglers"]] == [2]
    finally:
        for p in ps:
            stop(p)


def test_top_refreshes_in_place_and_quits_on_q(daemon, dataset):
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx"))
    p = d.client("web", 0, 1, 100000, sleep_ms=20)
    try:
        wait_for(d, settled(), what="a verdict")
        top = subprocess.Popen([str(FEEDCTL), "--socket", d.socket, "top", "--interval", "0.2"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.0)
        top.stdin.write(b"q")
        top.stdin.flush()
        out, err = top.communicate(timeout=10)
        assert top.returncode == 0, err
        text = out.decode()
        assert text.count("\033[H") >= 2, "top redraws from the home position every frame"
        assert "worst: feed web rank 0/1: compute-bound" in text
        assert text.endswith("\033[?25h"), "the cursor is shown again on the way out"
    finally:
        stop(p)


def read_frames(fd, seconds):
    """What a pty's master side got in `seconds`, split into top's frames (each starts at cursor home)."""
    import select
    buf, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    frames = buf.decode(errors="replace").split("\033[H")[1:-1]  # the last may be cut
    clean = []
    for f in frames:
        f = re.sub(r"\033\[[0-9;?]*[A-Za-z]", "", f).replace("\r", "")
        clean.append(f.split("\n"))
    return clean


def test_top_fits_the_terminal_and_follows_a_resize(daemon, dataset):
    """In an 80x24 terminal no line wraps and the frame leaves the last row free (the header never scrolls away);
    after a resize to 40x8 and SIGWINCH the next frames fit that."""
    import fcntl
    import pty
    import termios
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx"))
    ps = [d.client("web", r, 4, 100000, sleep_ms=20) for r in range(4)]
    master, slave = pty.openpty()
    top = None
    try:
        wait_for(d, settled(), what="a verdict")
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        top = subprocess.Popen([str(FEEDCTL), "--socket", d.socket, "top", "--interval", "0.3"],
                               stdin=slave, stdout=slave, stderr=subprocess.PIPE)
        frames = read_frames(master, 2.0)
        assert len(frames) >= 2
        for f in frames:
            assert len(f) <= 23, f
            assert max(len(l) for l in f) <= 80, f
            assert f[0].startswith("feedctl top")
        # The status of 4 clients is longer than 7 rows and wider than 40 columns: it is cut, not wrapped.
        assert max(len(l) for fr in frames for l in fr) > 40 and max(len(fr) for fr in frames) > 7
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 8, 40, 0, 0))
        top.send_signal(signal.SIGWINCH)
        time.sleep(0.2)
        frames = read_frames(master, 1.5)
        assert frames
        for f in frames:
            assert len(f) <= 7 and max(len(l) for l in f) <= 40, f
            assert f[0].startswith("feedctl top")
        os.write(master, b"q")
        assert top.wait(timeout=10) == 0
    finally:
        if top and top.poll() is None:
            top.kill()
            top.wait()
        os.close(master)
        os.close(slave)
        for p in ps:
            stop(p)


@pytest.mark.skipif(shutil.which("gnuplot") is None, reason="gnuplot is not installed (scripts/install-deps.sh)")
def test_report_writes_pngs_and_a_summary(daemon, dataset, tmp_path):
    d = daemon(DIAG + feed_conf("web", f"{dataset}/shard_*.idx"))
    base_fds = open_fds(d.proc.pid)
    ps = [d.client("web", 0, 2, 100000, sleep_ms=15), d.client("web", 1, 2, 100000, hold=True)]
    try:
        wait_for(d, settled(), what="a verdict")
        time.sleep(1.5)
        out = tmp_path / "report"
        r = d.ctl("report", "--out", str(out), "--minutes", "2")
        st = d.status()
        ids = {c["rank"]: c["id"] for c in st["clients"]}
        for rank in (0, 1):
            png = out / f"client-{ids[rank]}-web-rank{rank}.png"
            data = png.read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
            assert data[12:16] == b"IHDR"
            assert struct.unpack(">II", data[16:24]) == (1100, 800)
            assert len(data) > 10000, f"{png} is suspiciously small ({len(data)} bytes)"
        md = (out / "summary.md").read_text()
        assert "compute-bound: data wait" in md and "client slow to release" in md
        assert f"(client-{ids[0]}-web-rank0.png)" in md
        assert "### Stages of feed web" in md
        assert "wrote" in r.stderr
        # Where time goes: every share is 0..100 and each bar sums to 100 % (the parts are of one whole).
        for rank in (0, 1):
            rows = (out / f"client-{ids[rank]}-web-rank{rank}-time.dat").read_text().splitlines()[1:]
            for row in rows:
                vals = [float(v) for v in row.rsplit('"', 1)[1].split()]
                assert all(0 <= v <= 100 for v in vals), row
                assert sum(vals) == pytest.approx(100, abs=0.01) or sum(vals) == 0, row
        # The title is two lines: a double-quoted gnuplot string with \\n (a single-quoted one printed "\\n").
        gp = (out / f"client-{ids[1]}-web-rank1.gp").read_text()
        title = next(l for l in gp.splitlines() if l.startswith("set multiplot"))
        assert re.fullmatch(r'set multiplot layout 2,1 title "client \d+: feed web rank 1/2\\nclient slow to release: .*"',
                            title), title
    finally:
        for p in ps:
            stop(p)
    assert open_fds(d.proc.pid) == base_fds, "feedd leaked file descriptors after the clients went"


def test_bad_diagnosis_key_names_file_and_line(tmp_path, dataset):
    conf = tmp_path / "bad.conf"
    text = feed_conf("web", f"{dataset}/shard_*.idx") + "\n[diagnosis]\nwindow_s = 6\nstarved_pct = lots\n"
    conf.write_text(text)
    line = text.splitlines().index("starved_pct = lots") + 1
    p = subprocess.run([str(FEEDD), "-c", str(conf), "--check"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert f"{conf}:{line}: starved_pct: 'lots' is not a number in 0..100" in p.stderr, p.stderr
