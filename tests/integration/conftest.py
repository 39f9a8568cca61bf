# SPDX-License-Identifier: MIT
"""Fixtures for integration tests: real feedd processes, real sockets, real shards.

Runs with Debian's /usr/bin/python3 (python3-pytest, python3-numpy). meson
passes the build directory in FEEDD_BUILD_DIR; run by hand with
  FEEDD_BUILD_DIR=build /usr/bin/python3 -m pytest tests/integration
"""

import itertools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

SRC = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FEEDD_BUILD_DIR", SRC / "build")).resolve()
FEEDD = BUILD / "daemon" / "feedd"
FEEDCTL = BUILD / "client" / "feedctl" / "feedctl"
STREAM_CLIENT = BUILD / "tests" / "integration" / "stream-client"
# scripts/valgrind.sh and scripts/sanitize.sh run every feedd under a wrapper and/or with its own environment
# ("valgrind --error-exitcode=99 ..."; "ASAN_OPTIONS=detect_leaks=1"), and stretch the start and stop
# time limits by FEEDD_TEST_TIME_SCALE.
DAEMON_WRAPPER = shlex.split(os.environ.get("FEEDD_DAEMON_WRAPPER", ""))
# Whether feedd's RSS is its own: under a wrapper (valgrind) or a sanitizer's allocator (which keeps what is
# freed in quarantine) it is not, and a test bounding RSS skips (the feedd binary's libasan link says which).
RSS_IS_FEEDDS = not DAEMON_WRAPPER and "libasan" not in subprocess.run(
    ["ldd", str(FEEDD)], capture_output=True, text=True).stdout
RSS_SKIP_REASON = "RSS is the allocator's: valgrind's or a sanitizer's (it keeps what is freed in quarantine)"
DAEMON_ENV = dict(kv.split("=", 1) for kv in shlex.split(os.environ.get("FEEDD_DAEMON_ENV", "")))
TIME_SCALE = float(os.environ.get("FEEDD_TEST_TIME_SCALE", "1"))
# Valgrind cannot see the kernel write io_uring's reads into memory (every token would look uninitialised),
# so scripts/valgrind.sh sets FEEDD_DAEMON_IO_ENGINE=pread: configs that do not choose an engine get it.
DAEMON_IO_ENGINE = os.environ.get("FEEDD_DAEMON_IO_ENGINE", "")


def pin_virtual_ranks(conf_text):
    """Most tests check the per-rank contract of sections 3-16 against reference(): every feed whose section
    does not mention virtual_ranks gets `virtual_ranks = 0` (feedd's default is 1024, section 17), in a section
    reopened at the end so that no line number moves. A test of the default names it, e.g. with a comment
    ("# virtual_ranks: feedd's default", what feed_conf(vranks=None) writes)."""
    names, mentioned, cur = [], set(), None
    for line in conf_text.splitlines():
        t = line.strip()
        if t.startswith("[") and t.endswith("]"):
            sec = t[1:-1].strip()
            cur = sec[5:] if sec.startswith("feed.") and "." not in sec[5:] else None
            if cur is not None and cur not in names:
                names.append(cur)
        elif cur is not None and "virtual_ranks" in t:
            mentioned.add(cur)
    pins = "".join(f"[feed.{n}]\nvirtual_ranks = 0\n" for n in names if n not in mentioned)
    if not pins:
        return conf_text
    return conf_text + ("" if conf_text.endswith("\n") else "\n") + pins


def with_io_engine(conf_text):
    """The conf a test's feedd reads: pin_virtual_ranks(), and the io_engine asked for by the environment."""
    conf_text = pin_virtual_ranks(conf_text)
    if not DAEMON_IO_ENGINE or "io_engine" in conf_text:
        return conf_text
    if "[feedd]\n" in conf_text:
        return conf_text.replace("[feedd]\n", f"[feedd]\nio_engine = {DAEMON_IO_ENGINE}\n", 1)
    return f"[feedd]\nio_engine = {DAEMON_IO_ENGINE}\n" + conf_text

# The `feed` package under test: the source tree's (client/python, loading $FEEDD_BUILD_DIR's libfeed), or,
# with FEED_TEST_INSTALLED=1, whatever the interpreter has installed (tests/python/test_wheel.py runs the
# Python tests in a venv that pip installed the wheel into).
FEED_INSTALLED = os.environ.get("FEED_TEST_INSTALLED") == "1"


def use_feed_package():
    """Makes `import feed` import the package under test; returns the PYTHONPATH for child processes."""
    if FEED_INSTALLED:
        return ""
    path = str(SRC / "client" / "python")
    if path not in sys.path:
        sys.path.insert(0, path)
    return path


sys.path.insert(0, str(SRC / "tests" / "ref"))
sys.path.insert(0, str(SRC / "scripts"))
import feed_ref  # noqa: E402
import gen_megatron  # noqa: E402


def _fds_but_idle_rings(pid):
    """The fds of pid, less the memfds of idle rings feedd keeps for a uid's next attach (daemon/ring/ring.h,
    struct ring_pool: at most 16 MiB of them, let go once idle for 0.5 s at a tick): kept on purpose, not a
    leak. A ring still in use has its consumer page and eventfds too, which count."""
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:feedd-ring"):
                continue
        except OSError:
            continue  # closed meanwhile
        fds.append(fd)
    return sorted(fds)


def open_fds(pid, settle=0.1, timeout=5):
    """The daemon's open fds once they stop changing (connections close asynchronously), idle rings aside."""
    deadline = time.time() + timeout
    last = _fds_but_idle_rings(pid)
    while time.time() < deadline:
        time.sleep(settle)
        now = _fds_but_idle_rings(pid)
        if now == last:
            return now
        last = now
    return last


def wait_attached(d, proc, timeout=30):
    """Waits until feedd lists proc as a client (reading its stdout here would buffer lines away from communicate())."""
    deadline = time.time() + timeout
    while proc.pid not in {c["pid"] for c in d.status()["clients"]}:
        assert proc.poll() is None, f"client exited with {proc.returncode}: {proc.stderr.read()}"
        assert time.time() < deadline, "client did not attach"
        time.sleep(0.02)


def stream_client_env(reconnect_ms):
    """The environment of a stream-client with libfeed's reconnect_timeout set (None: libfeed's default)."""
    if reconnect_ms is None:
        return None
    return {**os.environ, "STREAM_RECONNECT_MS": str(reconnect_ms)}


def socket_answers(path):
    """Whether a unix socket at path accepts a connection now."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A feedd process on its own socket, stopped with SIGTERM at the end."""

    def __init__(self, tmp, conf_text, name="feedd", threads=None, extra=()):
        self.tmp = Path(tmp)
        self.conf = self.tmp / f"{name}.conf"
        self.conf.write_text(with_io_engine(conf_text))
        self.socket = str(self.tmp / f"{name}.sock")
        self.log = self.tmp / f"{name}.log"
        args = [str(FEEDD), "-c", str(self.conf), "-s", self.socket]
        if threads is not None:
            args += ["-t", str(threads)]
        args += list(extra)
        self.proc = subprocess.Popen(DAEMON_WRAPPER + args, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
                                     env={**os.environ, **DAEMON_ENV} if DAEMON_ENV else None)
        deadline = time.time() + 10 * TIME_SCALE
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"feedd exited with {self.proc.returncode}:\n{self.log.read_text()}")
            if socket_answers(self.socket):
                break
            time.sleep(0.02)
        else:
            raise RuntimeError("feedd did not start listening:\n" + self.log.read_text())

    def ctl(self, *args, check=True, timeout=60):
        p = subprocess.run([str(FEEDCTL), "--socket", self.socket, *args], capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"feedctl {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def status(self):
        return json.loads(self.ctl("status", "--json").stdout)

    def dump(self, feed, out, rank=0, world=1, batches=10, cursor=None, check=True):
        args = ["dump", feed, "--rank", str(rank), "--world", str(world), "--batches", str(batches),
                "--out", str(out)]
        if cursor:
            args += ["--cursor", cursor]
        p = self.ctl(*args, check=check)
        if p.returncode != 0:
            return p
        return load_dump(out)

    def client(self, feed, rank, world, batches, cursor=None, sleep_ms=0, hold=False, reconnect_ms=None):
        """tests/integration/stream-client; reconnect_ms: its reconnect_timeout (None: libfeed's default)."""
        return subprocess.Popen([str(STREAM_CLIENT), self.socket, feed, str(rank), str(world), str(batches),
                                 cursor or "-", str(sleep_ms), "1" if hold else "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=stream_client_env(reconnect_ms))

    def log_text(self):
        return self.log.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10 * TIME_SCALE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"feedd did not stop on SIGTERM within {10 * TIME_SCALE:g} s")
        return self.proc.returncode


def assert_batches_equal(got, exp, first=0):
    """A dump equals the reference's batches, or the first difference is named."""
    assert got["input_ids"].shape[0] == len(exp)
    for i, e in enumerate(exp):
        for k in ("input_ids", "labels", "position_ids"):
            if not np.array_equal(got[k][i], e[k]):
                bad = np.argwhere(got[k][i] != e[k])[0]
                raise AssertionError(f"batch {first + i}: {k} differs first at {tuple(bad)}: "
                                     f"got {got[k][i][tuple(bad)]}, expected {e[k][tuple(bad)]}")
        assert np.array_equal(got["cu_seqlens"][i], e["cu_seqlens"]), f"batch {first + i}: cu_seqlens differ"


def load_dump(out):
    out = Path(out)
    d = {k: np.load(out / f"{k}.npy") for k in ("input_ids", "labels", "position_ids")}
    d["cursors"] = (out / "cursors.txt").read_text().split()
    d["cu_seqlens"] = [np.array(l.split(), dtype=np.int32) for l in (out / "cu_seqlens.txt").read_text().splitlines()]
    return d


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(conf_text, **kw):
        d = Daemon(tmp_path, conf_text, name=f"feedd{len(started)}", **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        rc = d.stop()
        assert rc == 0, f"feedd exited with {rc} on SIGTERM:\n{d.log_text()}"


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """4 u16 shards with empty and multi-sequence documents (~1.2M tokens)."""
    d = tmp_path_factory.mktemp("data")
    gen_megatron.main([str(d), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                       "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", "3"])
    return d


def feed_conf(name, shards, seq_len=256, batch_size=4, seed=7, shuffle="true", window=2, bos="none",
              eos="none", extra="", vranks=0):
    """A feed's section. vranks: virtual_ranks (0, the default here: one stream per rank, sections 3-16,
    which reference() reproduces); None leaves it to feedd's default (1024: reference_virtual())."""
    v = ("# virtual_ranks: feedd's default\n" if vranks is None else
         "" if "virtual_ranks" in extra else f"virtual_ranks = {vranks}\n")
    return (f"[feed.{name}]\nshards = {shards}\nseq_len = {seq_len}\nbatch_size = {batch_size}\n"
            f"seed = {seed}\nshuffle = {shuffle}\nshuffle_window = {window}\nbos = {bos}\neos = {eos}\n{v}{extra}")


VRANKS_DEFAULT = 1024  # feedd's virtual_ranks when unset (docs/configuration.md)


def reference_virtual(shard_glob, rank, world, n, seq_len=256, batch_size=4, seed=7, shuffle=True, window=2, bos=None,
                      eos=None, vranks=VRANKS_DEFAULT):
    """reference() for a feed with virtual ranks ("concat", section 17): rank's first n batches."""
    shards = feed_ref.load_shards(feed_ref.expand_globs([str(shard_glob)]))
    vp = feed_ref.effective_vranks(vranks, [sum(s.docs for s in shards)])

    def rows_of(v, first):
        rs = feed_ref.RankStream(shards, seed, shuffle, window, vp, v, bos=bos, eos=eos, virtual=True)
        return rs.batches(seq_len, 1, start_batch=first)

    batches = feed_ref.virtual_batches(rows_of, feed_ref.virtual_streams(vp, world, rank), batch_size, seq_len)
    return list(itertools.islice(batches, n))


def reference(shard_glob, rank, world, n, seq_len=256, batch_size=4, seed=7, shuffle=True, window=2, bos=None,
              eos=None, start=0):
    shards = feed_ref.load_shards(feed_ref.expand_globs([str(shard_glob)]))
    rs = feed_ref.RankStream(shards, seed, shuffle, window, world, rank, bos=bos, eos=eos)
    return list(rs.batches(seq_len, batch_size, start_batch=start, count=n))


def write_sparse_shard(prefix, n_docs, tokens=8, uncached=False):
    """A u16 Megatron shard of n_docs documents of `tokens` tokens (zeros: a sparse .bin), written with numpy;
    `uncached`: the .idx is written to disk and dropped from the page cache, so that whoever reads it next is
    charged for its pages."""
    with open(f"{prefix}.bin", "wb") as f:
        f.truncate(n_docs * tokens * 2)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + np.array([1], "<u8").tobytes() + bytes([8]))
        f.write(np.array([n_docs, n_docs + 1], "<u8").tobytes())
        f.write(np.full(n_docs, tokens, "<i4").tobytes())
        f.write((np.arange(n_docs, dtype="<i8") * (tokens * 2)).tobytes())
        f.write(np.arange(n_docs + 1, dtype="<i8").tobytes())
        if uncached:
            f.flush()
            os.fdatasync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def remove_cgroup(cg):
    """Removes a cgroup made by a test, once its processes have gone (the kernel frees it a little after)."""
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@contextmanager
def peak_size(folder, size_of):
    """Polls size_of(folder) every 2 ms while the block runs (once folder exists): yields a list whose [0] is
    the largest size seen, for caps that must hold at every moment, not only at the end."""
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if folder.exists():
                peak[0] = max(peak[0], size_of(folder))
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    w.start()
    try:
        yield peak
    finally:
        stop.set()
        w.join()
