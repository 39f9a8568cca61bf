# SPDX-License-Identifier: MIT
"""The registry of bench/run.sh's experiments, and helpers shared by them.

Each experiment is a folder bench/NAME/ with its driver, run.py (or a C
helper built as BUILD/bench/NAME), and whatever notes it keeps. EXPERIMENTS
lists them all in the order run.sh runs them; `common.py --list` prints it
for run.sh, and bench/report.py takes the doc's sections from it.

Runs with Debian's /usr/bin/python3. Each experiment builds a result: a dict
with its title, command, the conditions every table must state (machine,
date, data size, cache state), one or more tables (columns, rows, with the
ratio to the peer as a column) and notes; `emit()` prints it and writes it as
JSON for bench/report.py, which renders docs/benchmarks.md and the plots.
"""

import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SRC / "scripts"))
import gen_megatron  # noqa: E402,F401  (re-exported for the experiments)

CLK_TCK = os.sysconf("SC_CLK_TCK")

# (name, kind, title in docs/benchmarks.md or None, whether bench/NAME/run.py takes --build)
# kind: "json": run.py takes arg_parser()'s options and writes a result (emit) that report.py renders;
#       "text": run as it is (bench/NAME/run.py, else BUILD/bench/NAME), its output kept verbatim;
#       "print": run.py --build --rounds, its output printed beside the results (figures kept by hand);
#       "tok": BUILD/bench/tok/bench-tok on scripts/fetch-tok-data.sh's corpus.
EXPERIMENTS = [
    ("io", "json", None, True),
    ("parallel", "json", None, True),
    ("starvation", "text", "3. CPU starvation: step time vs per-batch cost", True),
    ("padding", "text", "4. Padding tax: naive vs packed", True),
    ("gpu_h2d", "text", "5. PCIe: pinned vs pageable host-to-device copies, and overlap", False),
    ("gpu_trainer", "text", None, False),
    ("e2e", "json", None, True),
    ("scaling", "json", None, True),
    ("textpath", "json", None, True),
    ("checksum", "json", None, True),
    ("parquet", "json", None, True),
    ("torch_loop", "text", None, True),
    ("metrics_scrape", "text", None, True),
    ("telemetry_overhead", "text", None, True),
    ("spine", "print", None, True),
    ("restart", "text", None, True),
    ("loadtest", "text", None, True),
    ("elastic", "text", None, True),
    ("tok", "tok", None, False),
    ("scale", "json", None, True),
    ("s3", "json", None, True),
    ("watch", "text", None, True),
    ("hugedoc", "text", None, True),
]


def train_steps(batches, model, opt, steps):
    """Trains `steps` steps of a model taking (input_ids, labels, position_ids); returns (wall s, s blocked
    in next(), tokens). The first batch is taken before timing: start-up is not the steady state."""
    it = iter(batches)
    next(it)
    waited, tokens = 0.0, 0
    t_start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        b = next(it)
        waited += time.perf_counter() - t0
        loss = model(b["input_ids"], b["labels"], b["position_ids"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        tokens += b["input_ids"].numel()
        del b, loss
    return time.perf_counter() - t_start, waited, tokens


def arg_parser():
    """The options every experiment takes: --build, --full, --rounds, --json, --note."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(SRC / "build"))
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--note")
    return ap


def machine(note=None):
    """One line naming the machine this run measured."""
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // (1024 * 1024)
    distro = "Linux"
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                distro = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    load = os.getloadavg()[0]
    s = (f"{distro}, {platform.machine()}, {os.cpu_count()} CPUs, {mem} GiB, kernel {platform.release()}, "
         f"load average {load:.1f} at start")
    return f"{s}; {note}" if note else s


def date():
    return os.environ.get("BENCH_DATE") or time.strftime("%Y-%m-%d")


def start_feedd(build, conf_text, tmp, name="feedd", env=None, preexec_fn=None, wait_s=20):
    """Starts build/daemon/feedd on its own config and socket (env: its environment, None: ours;
    preexec_fn: run in the child before exec, e.g. to join a memory cgroup); returns (Popen, socket
    path) once it listens, within about wait_s seconds."""
    tmp = Path(tmp)
    conf = tmp / f"{name}.conf"
    conf.write_text(conf_text)
    sock = str(tmp / f"{name}.sock")
    log = tmp / f"{name}.log"
    p = subprocess.Popen([str(Path(build) / "daemon/feedd"), "-c", str(conf), "-s", sock], env=env,
                         stdout=subprocess.DEVNULL, stderr=open(log, "w"), preexec_fn=preexec_fn)
    for _ in range(int(wait_s * 40)):
        if p.poll() is not None:
            raise RuntimeError(f"feedd exited with {p.returncode}:\n{log.read_text()}")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return p, sock
        except OSError:
            time.sleep(0.025)
    p.kill()
    p.wait()
    raise RuntimeError("feedd did not start listening:\n" + log.read_text())


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def consume(build, sock, feed, batches, daemon=None, samples=1):
    """bench/consume takes `batches` batches of `feed` back to back (timing `samples` of
    them one by one); returns its JSON with "cpu_s" (the client's CPU, plus the daemon's
    when `daemon`, its Popen, is given) and "daemon_cpu_s"."""
    d_cpu0, c_cpu0 = (proc_cpu(daemon.pid) if daemon else 0.0), children_cpu()
    out = subprocess.run([str(Path(build) / "bench/consume"), str(sock), feed, str(batches), str(samples), "0"],
                         capture_output=True, text=True, check=True).stdout
    d_cpu = proc_cpu(daemon.pid) - d_cpu0 if daemon else 0.0
    r = json.loads(out)
    r["daemon_cpu_s"] = d_cpu
    r["cpu_s"] = d_cpu + children_cpu() - c_cpu0
    return r


def proc_cpu(pid):
    """User + system CPU seconds of a live process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_mem(pid):
    """{VmHWM, VmRSS, RssAnon, RssFile, RssShmem} in MiB from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) / 1024
    return out


def children_cpu():
    """CPU seconds of this process's reaped children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def evict(paths):
    """Drops these files' clean pages from the page cache (posix_fadvise DONTNEED), and only theirs."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_cold(paths):
    """Evicts the files from the page cache; returns a line saying how, and checked how.

    posix_fadvise(DONTNEED) drops exactly these files' clean pages (any user,
    and it leaves the other engineers' caches alone); as root the whole page
    cache is dropped too, as the issue asks. Then mincore (fincore) must show
    no page of them resident, else this raises.
    """
    os.sync()
    evict(paths)
    how = "posix_fadvise(DONTNEED) on every data file"
    if os.geteuid() == 0:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            how = "sync; echo 1 > /proc/sys/vm/drop_caches, and posix_fadvise(DONTNEED) on every data file"
        except OSError:
            pass
    resident = resident_bytes(paths)
    if resident is not None and resident > 0.01 * sum(os.path.getsize(p) for p in paths):
        raise RuntimeError(f"cache not cold: {resident} bytes of the data still resident")
    return how + ("" if resident is None else f"; fincore: {resident} bytes resident before the run")


def resident_bytes(paths):
    """Bytes of the files in the page cache (util-linux fincore), or None without fincore."""
    total = 0
    for i in range(0, len(paths), 500):
        try:
            out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *paths[i:i + 500]],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        total += sum(int(x) for x in out.split())
    return total


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def progress(msg):
    """A progress line on stderr, so that a long run shows where it is."""
    print(msg, file=sys.stderr, flush=True)


def fmt(v):
    """Human figures for tables: 3 significant digits, M/k suffixes for large numbers."""
    if isinstance(v, str):
        return v
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g} G"
    if a >= 1e6:
        return f"{v / 1e6:.3g} M"
    if a >= 1e4:
        return f"{v / 1e3:.3g} k"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def ratio(v, peer):
    return f"{v / peer:.2f}x" if peer else "-"


def print_result(res):
    print(f"== {res['title']}")
    for k in ("machine", "date", "data", "cache"):
        print(f"   {k}: {res[k]}")
    for t in res["tables"]:
        print(f"   -- {t['caption']}")
        cols = t["columns"]
        rows = [[fmt(c) for c in r] for r in t["rows"]]
        w = [max(len(str(c)) for c in col) for col in zip(cols, *rows)]
        print("   " + "  ".join(str(c).ljust(w[i]) if i == 0 else str(c).rjust(w[i]) for i, c in enumerate(cols)))
        for r in rows:
            print("   " + "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    for n in res.get("notes", []):
        print(f"   note: {n}")
    sys.stdout.flush()


def emit(res, out):
    """Prints the result and writes it to `out` (JSON) when given."""
    print_result(res)
    if out:
        Path(out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    # bench/run.sh asks: one experiment a line, "NAME KIND BUILD_ARG".
    if sys.argv[1:] == ["--list"]:
        for name, kind, _, build_arg in EXPERIMENTS:
            print(name, kind, int(build_arg))
    else:
        sys.exit("usage: common.py --list")
