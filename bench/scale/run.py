#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment: start-up, memory and throughput against corpus size (issue #22).

Runs with Debian's /usr/bin/python3, the build's daemon/feedd and
bench/consume, and a peer build of v0.1 (main before issue #22; --peer
BUILD, e.g. a `git worktree add /tmp/v01 main` built with meson). For each
corpus size, each daemon in turn, on the same files:

  ready_s        from exec to the socket answering (feeds are loaded first: READY=1)
  first_batch_s  from exec to the first batch received by a client attached at once
  index_s        from exec to the whole index validated (v0.1: at load; this version:
                 status work_ahead.index_shards_pending reaching 0)
  anon_mib       the daemon's anonymous memory after that first batch and at the
                 end (/proc/PID/smaps_rollup "Anonymous"); the rings are shared
                 memory (RssShmem) and not in it
  file_mib       its file-backed resident memory (mapped .idx pages: page cache)
  tok_s          steady tokens/s of one client taking BATCHES batches, after the index
                 is validated; the best of ROUNDS runs

Megatron shards are synthetic: SHARDS shards of DOCS/SHARDS documents of 8
u16 tokens each, one sequence per document. The .idx is written with numpy
(a few seconds for 100 M documents); the .bin is a sparse file (its tokens
are all 0: content does not matter here). A cold page cache is not asked
for: both daemons read the same files, which stay cached between runs.

  bench/scale/run.py [--build build] [--peer /tmp/v01/build] [--full] [--json out.json]
     default sizes: 1 M, 10 M, 100 M documents; --full adds 1 B (about 20 GB of .idx)
  bench/scale/run.py --sizes 1000000000 --shards 40 --mem-cap 6144 --data DIR
     the 1 B row as in docs/benchmarks.md: each daemon under a 6 GiB memory cgroup (v0.1 does not fit)
  bench/scale/run.py --text 100,1000,10000 [--tokenizer tokenizer.json] [--virtual-ranks default,0]
     N .jsonl.zst shards: ready, first batch, anonymous memory, bytes in cache_dir
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

TOKENS_PER_DOC = 8
B, L = 8, 2048
BATCHES = 2000
ROUNDS = 2


def write_shard(prefix, n_docs, drop_cache=False):
    """One Megatron shard of n_docs documents of TOKENS_PER_DOC u16 tokens; .bin sparse. The .idx is
    written in chunks of 2^24 entries (~128 MB at a time, whatever n_docs); drop_cache: written to disk
    and dropped from the page cache, so that the daemon reading it is charged for the pages it reads
    (with --mem-cap; 40 x 25 M documents are 20 GB of .idx, near this VM's RAM)."""
    idx = Path(str(prefix) + ".idx")
    if idx.exists():
        return idx
    with open(str(prefix) + ".bin", "wb") as f:
        f.truncate(n_docs * TOKENS_PER_DOC * 2)
    tmp = Path(str(idx) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], "<u8").tobytes())
        f.write(bytes([8]))  # u16
        f.write(np.array([n_docs, n_docs + 1], "<u8").tobytes())
        step = 1 << 24
        for a in range(0, n_docs, step):
            f.write(np.full(min(step, n_docs - a), TOKENS_PER_DOC, "<i4").tobytes())
        for a in range(0, n_docs, step):
            f.write((np.arange(a, min(a + step, n_docs), dtype="<i8") * (TOKENS_PER_DOC * 2)).tobytes())
        for a in range(0, n_docs + 1, step):
            f.write(np.arange(a, min(a + step, n_docs + 1), dtype="<i8").tobytes())
        if drop_cache:
            f.flush()
            os.fdatasync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    tmp.rename(idx)
    return idx


class MemCap:
    """A cgroup v1 memory group that each daemon joins before exec (--mem-cap MIB): its anonymous
    memory plus the page cache it brings in are capped at MIB, and a daemon over the cap is killed by
    the kernel's OOM killer inside the group rather than pushing the shared machine out of memory (v0.1
    copies ~23.5 bytes per document of .idx into RAM: ~24 GB at 1 B documents). A thread samples the
    group's memory.stat, so that a killed daemon's last figures are known."""

    ROOT = Path("/sys/fs/cgroup/memory")

    def __init__(self, mib):
        if not (self.ROOT / "cgroup.procs").exists():
            raise SystemExit(f"--mem-cap: no cgroup v1 memory controller at {self.ROOT}")
        self.mib = mib
        self.path = self.ROOT / f"feedd-scale-{os.getpid()}"
        self.path.mkdir()
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if (self.path / name).exists():
                (self.path / name).write_text(str(mib << 20))
        self.samples, self.stop_ev = [], None

    def join(self):
        """preexec_fn of the daemon: runs in the child, before exec."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def _read(self, name):
        return (self.path / name).read_text()

    def oom_kills(self):
        for line in self._read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def start(self):
        """Before a daemon: reset the peak, start sampling (t from now, anon MiB, page cache MiB)."""
        import threading
        (self.path / "memory.max_usage_in_bytes").write_text("0")
        self.kills0, self.t0, self.samples = self.oom_kills(), time.monotonic(), []
        self.stop_ev = threading.Event()

        def loop():
            while not self.stop_ev.wait(0.05):
                st = dict(line.split() for line in self._read("memory.stat").splitlines())
                self.samples.append((time.monotonic() - self.t0, int(st["rss"]) >> 20, int(st["cache"]) >> 20))
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def finish(self):
        """After a daemon that failed: stop sampling; returns None, or a sentence when the group's OOM killer
        killed it or it had reached the cap."""
        self.stop_ev.set()
        self.thread.join()
        peak = int(self._read("memory.max_usage_in_bytes")) >> 20
        anon = max((x[1] for x in self.samples), default=0)
        t_full = next((t for t, a, _ in self.samples if a >= anon * 0.98), 0)
        last = self.samples[-1][0] if self.samples else 0
        if self.oom_kills() != self.kills0:
            return (f"killed by the OOM killer of its {self.mib} MiB memory cgroup: {anon} MiB anonymous "
                    f"{t_full:.1f} s after exec (the group at its cap from then on, reclaiming), killed "
                    f"{last:.1f} s after exec (group peak {peak} MiB)")
        if anon >= self.mib * 0.9:  # e.g. stalled in reclaim at the cap until its own load_timeout_s
            return (f"at its {self.mib} MiB memory cgroup's cap: {anon} MiB anonymous {t_full:.1f} s after exec, "
                    f"gone {last:.1f} s after exec (group peak {peak} MiB)")
        return None

    def close(self):
        """Removes the group (its charges move to the parent) once its last daemon is gone."""
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)
        print(f"scale: could not remove {self.path}", file=sys.stderr)


def smaps(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Rss", "Anonymous", "Pss_File", "Pss_Shmem"):
                out[k] = int(v.split()[0]) / 1024
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def run_one(build, tmp, shards, shuffle, window, cap=None):
    if not cap:
        return run_one_(build, tmp, shards, shuffle, window, None)
    cap.start()
    try:
        return run_one_(build, tmp, shards, shuffle, window, cap.join)
    except Exception as e:
        oom = cap.finish()
        if oom:
            raise RuntimeError(f"{oom}; {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        raise
    finally:
        if not cap.stop_ev.is_set():
            cap.finish()


def run_one_(build, tmp, shards, shuffle, window, preexec_fn):
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\n[feed.b]\nshards = {shards}\nseq_len = {L}\n"
            f"batch_size = {B}\nseed = 1\nshuffle = {'true' if shuffle else 'false'}\nshuffle_window = {window}\n")
    t0 = time.monotonic()
    d, sock = common.start_feedd(build, conf, tmp, preexec_fn=preexec_fn, wait_s=300 if preexec_fn else 20)
    ready = time.monotonic() - t0
    try:
        r = subprocess.run([str(Path(build) / "bench/consume"), sock, "b", "1", "1", "0"], capture_output=True,
                           text=True)
        first = time.monotonic() - t0
        if r.returncode:
            raise RuntimeError(f"consume: {r.stderr}")
        m1 = smaps(d.pid)
        # Index validation after load (this version): steady state is measured once it is done.
        index = ready
        for _ in range(6000):
            st = subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "-s", sock, "status", "--json"],
                                capture_output=True, text=True)
            wa = json.loads(st.stdout)["feeds"][0].get("work_ahead") if st.returncode == 0 else None
            if not wa or wa["index_shards_pending"] == 0:
                break
            time.sleep(0.05)
        index = time.monotonic() - t0 if wa else ready
        steady = max((common.consume(build, sock, "b", BATCHES, daemon=d) for _ in range(ROUNDS)),
                     key=lambda x: x["tokens_per_s"])
        m2 = smaps(d.pid)
    finally:
        common.stop(d)
    return {"ready_s": ready, "first_batch_s": first, "index_s": index, "anon_mib": m1["Anonymous"], "anon_end_mib": m2["Anonymous"],
            "file_mib": m2["RssFile"], "shmem_mib": m2["RssShmem"], "hwm_mib": m2["VmHWM"],
            "tok_s": steady["tokens_per_s"]}


def with_ratio(rows, key_len, peer_name="v0.1"):
    """Each row with its tokens/s (last column) over the peer's row of the same key (row[1:key_len]) appended;
    None where the peer has no figure (it did not load, or it is the peer's own row)."""
    peer = {tuple(r[1:key_len]): r[-1] for r in rows if r[0] == peer_name}
    out = []
    for r in rows:
        p = peer.get(tuple(r[1:key_len]))
        out.append(r + [r[-1] / p if p and r[0] != peer_name else None])
    return out


def write_text_shards(folder, n_shards, docs=50):
    """n_shards .jsonl.zst shards of `docs` short documents each (zstd(1) compresses them)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    for i in range(n_shards):
        lines = [json.dumps({"text": " ".join(words[(i + k + j) % len(words)] for j in range(40))})
                 for k in range(docs)]
        raw = folder / f"t{i:05d}.jsonl"
        raw.write_text("\n".join(lines) + "\n")
    subprocess.run(["sh", "-c", f"cd {folder} && ls | grep '[.]jsonl$' | xargs zstd -q --rm"], check=True)
    (folder / "done").write_text("")


def du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


NOFILE = 524288  # systemd's default hard RLIMIT_NOFILE for a service; v0.1 holds 2 fds per text shard


def raise_nofile():
    """preexec_fn of a text daemon: RLIMIT_NOFILE as a systemd service gets it (root raises the hard limit)."""
    import resource
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    except (ValueError, OSError):
        pass


def run_text(build, tmp, shards, tokenizer, vranks=None):
    """vranks: the feed's virtual_ranks (None: left to feedd's default; v0.1 has no such key)."""
    cache = Path(tmp) / "cache"
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\ncache_dir = {cache}\n[feed.b]\nformat = jsonl\n"
            f"shards = {shards}\ntokenizer = {tokenizer}\nseq_len = 1024\nbatch_size = 8\nseed = 1\n"
            f"shuffle = true\nshuffle_window = 4\neos = 50256\n" +
            (f"virtual_ranks = {vranks}\n" if vranks is not None else ""))
    t0 = time.monotonic()
    # v0.1 indexes and copies every shard before it listens
    d, sock = common.start_feedd(build, conf, tmp, wait_s=600, preexec_fn=raise_nofile)
    ready = time.monotonic() - t0
    try:
        r = subprocess.run([str(Path(build) / "bench/consume"), sock, "b", "1", "1", "0"], capture_output=True,
                           text=True)
        first = time.monotonic() - t0
        if r.returncode:
            raise RuntimeError(f"consume: {r.stderr}")
        m1 = smaps(d.pid)
        steady = common.consume(build, sock, "b", 100, daemon=d)
        m2 = smaps(d.pid)
    finally:
        common.stop(d)
    return [ready, first, m1["Anonymous"], m2["Anonymous"], du(cache), steady["tokens_per_s"]]


def main_text(a):
    build, peer = Path(a.build), Path(a.peer)
    tokenizer = Path(a.tokenizer or (Path(a.build) / "tokdata/hf/gpt2.json"))
    counts = [int(x) for x in a.text.split(",")]
    vranks = [None if x == "default" else int(x) for x in a.virtual_ranks.split(",")]
    data = Path(a.data or tempfile.mkdtemp(prefix="feedd-scale-"))
    rows, notes = [], []
    for n in counts:
        folder = data / f"t{n}"
        common.progress(f"scale: writing {n} .jsonl.zst shards")
        write_text_shards(folder, n)
        runs = [(f"this, virtual_ranks {v}" if v is not None else "this", build, v) for v in vranks]
        for name, b, v in runs + [(a.peer_name, peer, None)]:
            with tempfile.TemporaryDirectory() as tmp:
                common.progress(f"scale: {name} {n} text shards")
                try:
                    rows.append([name, n] + run_text(b, tmp, f"{folder}/*.jsonl.zst", tokenizer, v))
                except Exception as e:
                    notes.append(f"{name} at {n} shards: {str(e)[:300]}")
                    print(notes[-1], flush=True)
                    continue
            print(json.dumps(rows[-1]), flush=True)
    res = {
        "title": "Scale: JSONL.zst shards, start-up and cache against shard count (issue #22)",
        "command": "bench/scale/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(a.note), "date": common.date(),
        "data": f"N .jsonl.zst shards of 50 short documents, GPT-2 tokenizer ({tokenizer.name}), shuffle_window 4",
        "cache": f"cache_dir empty at start; RLIMIT_NOFILE {NOFILE} (systemd's default hard limit) for both daemons",
        "tables": [{"caption": "per daemon and shard count",
                    "columns": ["daemon", "shards", "ready s", "first batch s", "anon MiB (first batch)",
                                "anon MiB (end)", "cache bytes", "tokens/s", f"tokens/s / {a.peer_name}"],
                    "rows": with_ratio(rows, 2, a.peer_name)}],
        "notes": notes,
    }
    common.emit(res, a.json)


def main():
    ap = common.arg_parser()
    ap.add_argument("--peer", default="/tmp/v01/build", help="a build of v0.1 (main before #22)")
    ap.add_argument("--peer-name", default="v0.1", help="the peer's name in the table (e.g. main, for another build)")
    ap.add_argument("--data", default=None, help="where to keep the shards (default: a temporary folder)")
    ap.add_argument("--sizes", default=None, help="comma-separated document counts (overrides the defaults)")
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--shuffle", default="off,on", help="off, on or off,on")
    ap.add_argument("--text", default=None, help="comma-separated .jsonl.zst shard counts: the text table instead")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for --text (default BUILD/tokdata/hf/gpt2.json)")
    ap.add_argument("--virtual-ranks", default="default",
                    help="--text: this build's virtual_ranks, comma-separated runs ('default': left unset, feedd's "
                         "1024; 0: one stream per rank, as v0.1, which has no such key)")
    ap.add_argument("--mem-cap", type=int, default=None, metavar="MIB",
                    help="run each daemon in a cgroup v1 memory group capped at MIB (anonymous + the page cache it "
                         "reads; over it the group's OOM killer ends the daemon, reported in the notes), and write "
                         "the shards out of the page cache; for --full on a shared machine")
    a = ap.parse_args()
    if a.text:
        return main_text(a)
    cap = MemCap(a.mem_cap) if a.mem_cap else None
    try:
        main_megatron(a, cap)
    finally:
        if cap:
            cap.close()


def main_megatron(a, cap):
    build, peer = Path(a.build), Path(a.peer)
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [10**6, 10**7, 10**8] + ([10**9] if a.full else [])
    data = Path(a.data or tempfile.mkdtemp(prefix="feedd-scale-"))
    rows, notes = [], []
    for n in sizes:
        folder = data / f"m{n}-{a.shards}"
        folder.mkdir(parents=True, exist_ok=True)
        common.progress(f"scale: writing {a.shards} shards of {n // a.shards} documents")
        for i in range(a.shards):
            write_shard(folder / f"s{i:05d}", n // a.shards, drop_cache=cap is not None)
        shards = str(folder / "*.idx")
        for shuffle in [x == "on" for x in a.shuffle.split(",")]:
            for name, b in (("this", build), (a.peer_name, peer)):
                if not (b / "daemon/feedd").exists():
                    notes.append(f"{name}: no build at {b}")
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    common.progress(f"scale: {name} {n} documents shuffle={shuffle}")
                    try:
                        res = run_one(b, tmp, shards, shuffle, 4, cap)
                    except Exception as e:  # the peer may not fit in memory at the largest sizes
                        notes.append(f"{name} at {n} documents, shuffle {shuffle}: {str(e)[:300]}")
                        print(notes[-1], flush=True)
                        continue
                rows.append([name, n, "on" if shuffle else "off", res["ready_s"], res["first_batch_s"], res["index_s"],
                             res["anon_mib"], res["anon_end_mib"], res["file_mib"], res["hwm_mib"], res["tok_s"]])
                print(json.dumps(rows[-1]), flush=True)
    res = {
        "title": "Scale: start-up, memory and throughput against corpus size (issue #22)",
        "command": "bench/scale/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": f"Megatron, {a.shards} shards of 8-token u16 documents (sparse .bin), shuffle_window 4, "
                f"B={B} L={L}, one client, {BATCHES} batches for tokens/s",
        "cache": (f"each daemon in a memory cgroup capped at {a.mem_cap} MiB (anonymous + page cache), shards "
                  "written out of the page cache" if cap else "page-cached (both daemons read the same files)"),
        "tables": [{
            "caption": "per daemon and corpus size",
            "columns": ["daemon", "documents", "shuffle", "ready s", "first batch s", "index valid s",
                        "anon MiB (first batch)",
                        "anon MiB (end)", "file MiB", "VmHWM MiB", "tokens/s", f"tokens/s / {a.peer_name}"],
            "rows": with_ratio(rows, 3, a.peer_name),
        }],
        "notes": notes,
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
