# SPDX-License-Identifier: MIT
"""Checksummed caches and shards (issue #16 part B, docs/checksums.md), with a real feedd.

- a flipped byte in a cache copy is found when the shard is first read after load, named (file and offset), the entry rebuilt, and the
  batches stay bit-identical to a fresh run; found while serving, it stops the session with the same message;
- a Megatron shard with an X.bin.sums sidecar and a flipped byte in .bin fails the feed naming file and offset,
  and serves the same batches as without a sidecar while intact;
- a crash while the cache is built leaves NAME.tmp-PID, which the next start removes;
- cache_max_bytes is never passed on disk across several shards and feedd processes (a copy is made when its
  shard is first read), a copy in use is never
  evicted, and an entry alone over the cap is refused with a clear message.

Text feeds need the cl100k rank file (scripts/fetch-tok-data.sh) and zstd; those tests skip without them.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, FEEDCTL, FEEDD, SRC, feed_conf, peak_size, with_io_engine

sys.path.insert(0, str(SRC / "scripts"))
import gen_megatron  # noqa: E402

RANKS = BUILD / "tokdata" / "ranks" / "cl100k_base.tiktoken"
needs_text = pytest.mark.skipif(not RANKS.exists() or not shutil.which("zstd"),
                                reason="cl100k rank file (scripts/fetch-tok-data.sh) or zstd missing")


def flip(path, at):
    """Flips one bit of the byte at `at`, keeping size and mtime (as a disk error or a careless tool would)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def zst_jsonl(path, n_docs, seed, words=60):
    """A .jsonl.zst of n_docs records of varied English-like text."""
    rng = np.random.default_rng(seed)
    vocab = ["alpha", "beta", "gamma", "delta", "checksum", "block", "the", "of", "and", "feed", "token", "cache",
             "shard", "rebuilt", "offset", "Grüße", "naïve", "日本", "x" * 7, "42", "—", "end."]
    lines = []
    for i in range(n_docs):
        k = int(rng.integers(5, words))
        text = " ".join(vocab[j] for j in rng.integers(0, len(vocab), k))
        lines.append('{"text": "%d %s"}' % (i, text))
    raw = path.with_suffix("")
    raw.write_text("\n".join(lines) + "\n")
    subprocess.run(["zstd", "-q", "-f", "--rm", str(raw), "-o", str(path)], check=True)
    return path


def text_conf(cache, feeds, extra_daemon=""):
    """feeds: {name: [paths]}."""
    out = f"[feedd]\ncache_dir = {cache}\n{extra_daemon}"
    for name, paths in feeds.items():
        shards = ",\n  ".join(map(str, paths))
        out += (f"[feed.{name}]\nformat = jsonl\nshards = {shards}\ntokenizer = {RANKS}\n"
                f"tokenizer_preset = cl100k_base\nseq_len = 128\nbatch_size = 4\nseed = 5\nshuffle = true\n"
                f"shuffle_window = 2\nbos = none\neos = <|endoftext|>\n")
    return out


def data_files(cache):
    return sorted(p for p in Path(cache).iterdir() if p.name.endswith(".data"))


def positions(cursors):
    """The cursors' stream positions: without <data> (section 8.1), which a sidecar changes, and <check>."""
    return [c.split("-")[:9] for c in cursors]


def same(a, b, data_identity=True):
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(a[k], b[k]), k
    if data_identity:
        assert a["cursors"] == b["cursors"]
    else:
        assert positions(a["cursors"]) == positions(b["cursors"])


@needs_text
def test_a_flipped_byte_in_a_cache_copy_is_named_and_the_copy_rebuilt(daemon, tmp_path):
    # Over 4 MiB decompressed: its copy is a file in cache_dir (a smaller one's is made in memory).
    shard = zst_jsonl(tmp_path / "web.jsonl.zst", 30000, seed=1)
    cache = tmp_path / "cache"
    conf = text_conf(cache, {"web": [shard]})
    d = daemon(conf)
    fresh = d.dump("web", tmp_path / "fresh", batches=40)
    assert d.stop() == 0
    (copy,) = data_files(cache)
    size = copy.stat().st_size
    at = size // 2
    flip(copy, at)
    assert copy.stat().st_size == size

    # When the shard is first read after load (its copy is opened on use): found, named, rebuilt;
    # the batches are those of a fresh cache, bit for bit.
    d2 = daemon(conf)
    block = at // 4096 * 4096
    after = d2.dump("web", tmp_path / "after", batches=40)
    log = d2.log_text()
    assert f"{copy}: block at byte {block} " in log and "rebuilt" in log, log
    same(after, fresh)
    with open(copy, "rb") as f:
        f.seek(at)
        assert f.read(1) != b""  # the copy is there again, whole
    assert d2.stop() == 0

    # While serving (the copy open and checked whole already): the session stops with the file and
    # offset before any batch from a damaged block (every block of the text damaged: the shard is too
    # large for 400 batches to reach one given block).
    d3 = daemon(conf)
    d3.dump("web", tmp_path / "opened", batches=1)
    for b in range(0, size - size // 50, 4096):
        flip(copy, b + 100)
    p = d3.dump("web", tmp_path / "serving", batches=400, check=False)
    assert not isinstance(p, dict) and p.returncode != 0, "a damaged block was served"
    m = re.search(re.escape(str(copy)) + r": block at byte (\d+) ", p.stderr)
    assert m and int(m.group(1)) % 4096 == 0, p.stderr
    assert "does not match its checksum" in p.stderr
    st = next(f for f in d3.status()["feeds"] if f["name"] == "web")
    assert st["state"] == "failed" and f"{copy}: block at byte " in st["error"], st


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    gen_megatron.main([str(d), "--shards", "3", "--docs-per-shard", "300", "--mean-len", "500", "--empty-frac",
                       "0.05", "--multi-seq-frac", "0.2", "--seed", "9"])
    return d


def test_megatron_sidecar_verifies_every_block(daemon, tmp_path, shards):
    conf = feed_conf("web", shards / "*.idx")
    d = daemon(conf)
    plain = d.dump("web", tmp_path / "plain", rank=0, world=2, batches=60)
    assert d.stop() == 0

    r = subprocess.run([str(FEEDCTL), "verify", "--write-sums", *map(str, sorted(shards.glob("*.idx")))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(list(shards.glob("*.bin.sums"))) == 3

    # With sidecars: the same batches, bit for bit.
    d = daemon(conf)
    # A sidecar's digest stands for inode and ctime in the data identity: same positions, other <data>.
    same(d.dump("web", tmp_path / "summed", rank=0, world=2, batches=60), plain, data_identity=False)
    assert d.stop() == 0

    # A flipped byte in .bin (size and mtime kept): feedctl verify and the feed both name file and offset.
    bin0 = sorted(shards.glob("*.bin"))[0]
    at = bin0.stat().st_size // 3
    flip(bin0, at)
    block = at // 4096 * 4096
    r = subprocess.run([str(FEEDCTL), "verify", str(bin0)], capture_output=True, text=True)
    assert r.returncode == 1 and f"{bin0}: block at byte {block} " in r.stderr, r.stderr
    d = daemon(conf)
    failed = None
    for rank in range(2):
        p = d.dump("web", tmp_path / f"bad{rank}", rank=rank, world=2, batches=200, check=False)
        if not isinstance(p, dict):
            failed = p
            break
    assert failed is not None, "no rank read the damaged block"
    assert f"{bin0}: block at byte {block} " in failed.stderr and "does not match its checksum" in failed.stderr
    # The feed fails with it, not only the session that met it: no later attach is served.
    st = next(f for f in d.status()["feeds"] if f["name"] == "web")
    assert st["state"] == "failed" and f"{bin0}: block at byte {block} " in st["error"], st
    p = d.dump("web", tmp_path / "after", rank=0, world=2, batches=1, check=False)
    assert not isinstance(p, dict) and f"{bin0}: block at byte {block} " in p.stderr, p

    # A sidecar of another version of the shard (the .idx changed, still valid): the feed fails at load, naming it.
    flip(bin0, at)
    idx1 = sorted(shards.glob("*.idx"))[1]
    data = bytearray(idx1.read_bytes())
    n0 = int.from_bytes(data[34:38], "little")
    assert n0 > 0
    data[34:38] = (n0 - 1).to_bytes(4, "little")  # sequence 0 one token shorter: a gap, which Megatron allows
    idx1.write_bytes(bytes(data))
    d2 = daemon(conf)
    st = next(f for f in d2.status()["feeds"] if f["name"] == "web")
    assert st["state"] == "failed" and f"{idx1}: does not match the checksum in" in st["error"], st


def test_prep_writes_a_sidecar_that_feedd_checks(tmp_path):
    if not RANKS.exists():
        pytest.skip("cl100k rank file (scripts/fetch-tok-data.sh) missing")
    src = tmp_path / "in.jsonl"
    src.write_text("".join('{"text": "document %d about checksums and blocks"}\n' % i for i in range(2000)))
    out = tmp_path / "p"
    r = subprocess.run([str(FEEDCTL), "prep", "--tokenizer", str(RANKS), "--preset", "cl100k_base", "--out",
                        str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert Path(f"{out}.bin.sums").exists()
    r = subprocess.run([str(FEEDCTL), "verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "match" in r.stdout, r.stdout + r.stderr
    flip(Path(f"{out}.idx"), 40)
    r = subprocess.run([str(FEEDCTL), "verify", str(out)], capture_output=True, text=True)
    assert r.returncode == 1 and f"{out}.idx" in r.stderr, r.stderr


def start_feedd(tmp_path, conf_text, name):
    conf = tmp_path / f"{name}.conf"
    conf.write_text(with_io_engine(conf_text))
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen([str(FEEDD), "-c", str(conf), "-s", str(tmp_path / f"{name}.sock")],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    return proc, log


@needs_text
def test_a_crash_while_the_cache_is_built_leaves_a_tmp_file_the_next_start_removes(daemon, tmp_path):
    # ~400 MB of text in a small .zst: its decompression takes long enough to be interrupted.
    raw = tmp_path / "big.jsonl"
    line = b'{"text": "' + b"all work and no play makes a dull cache " * 50 + b'"}\n'
    with open(raw, "wb") as f:
        chunk = line * 2000
        for _ in range(200):
            f.write(chunk)
    subprocess.run(["zstd", "-q", "-f", "--rm", "-1", str(raw), "-o", str(tmp_path / "big.jsonl.zst")], check=True)
    cache = tmp_path / "cache"
    conf = text_conf(cache, {"big": [tmp_path / "big.jsonl.zst"]})
    proc, log = start_feedd(tmp_path, conf, "crash")
    # The copy is made when the shard is first read: a client asks for a batch.
    sock = str(tmp_path / "crash.sock")
    deadline = time.time() + 60
    while time.time() < deadline and not Path(sock).exists():
        time.sleep(0.01)
    reader = subprocess.Popen([str(FEEDCTL), "--socket", sock, "dump", "big", "--rank", "0", "--world", "1",
                               "--batches", "1", "--out", str(tmp_path / "crash-dump")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    tmp = []
    while time.time() < deadline and proc.poll() is None:
        tmp = [p for p in cache.glob("*.tmp-*")] if cache.exists() else []
        if tmp and tmp[0].stat().st_size > (8 << 20):
            break
        time.sleep(0.005)
    assert tmp, "feedd never started writing its cache copy:\n" + log.read_text()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.kill()
    reader.wait()
    assert tmp[0].exists(), "the killed build left no temporary file"
    # The next start (any feed on this cache_dir) removes it.
    d = daemon(text_conf(cache, {"small": [zst_jsonl(tmp_path / "small.jsonl.zst", 200, seed=3)]}))
    assert not tmp[0].exists(), "the crashed build's temporary file is still there"
    assert "removed 1 temporary files" in d.log_text(), d.log_text()
    assert not list(cache.glob("*.tmp-*"))


def du(cache):
    total = 0
    for p in Path(cache).iterdir():
        try:
            if p.name != ".lock":
                total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


@needs_text
def test_cache_max_bytes_is_never_passed_and_a_copy_in_use_is_never_evicted(daemon, tmp_path):
    paths = {n: zst_jsonl(tmp_path / f"{n}.jsonl.zst", 60000, seed=i) for i, n in enumerate("abcd")}
    cache = tmp_path / "cache"
    # Learn an entry's size with no cap (the copy is made when the shard is first read).
    probe = daemon(text_conf(tmp_path / "probe", {"a": [paths["a"]]}))
    probe.dump("a", tmp_path / "probe-dump", batches=1)
    entry = du(tmp_path / "probe")
    probe.stop()
    cap = int(entry * 2.6)
    with peak_size(cache, du) as peak:
        extra = f"cache_max_bytes = {cap}\n"
        # feedd 1 serves a (pinned) for the whole test.
        d1 = daemon(text_conf(cache, {"a": [paths["a"]]}, extra))
        a_before = d1.dump("a", tmp_path / "a0", batches=20)
        # feedd 2 builds b and stops: b stays, unpinned.
        d2 = daemon(text_conf(cache, {"b": [paths["b"]]}, extra))
        d2.dump("b", tmp_path / "b0", batches=2)
        assert d2.stop() == 0
        copies = {p.name.split("-", 1)[1] for p in data_files(cache)}
        assert copies == {"a.jsonl.zst.data", "b.jsonl.zst.data"}
        # feedd 3 needs room for c: b (least recently used, unpinned) goes; a, in use by feedd 1, stays.
        d3 = daemon(text_conf(cache, {"c": [paths["c"]]}, extra))
        d3.dump("c", tmp_path / "c0", batches=2)
        copies = {p.name.split("-", 1)[1] for p in data_files(cache)}
        assert copies == {"a.jsonl.zst.data", "c.jsonl.zst.data"}, copies
        same(d1.dump("a", tmp_path / "a1", batches=20), a_before)
        # feedd 4 finds a and c pinned: d cannot fit, and says so when d is read; nothing pinned is removed.
        d4 = daemon(text_conf(cache, {"d": [paths["d"]]}, extra))
        p = d4.dump("d", tmp_path / "d0", batches=1, check=False)
        assert not isinstance(p, dict) and "no room in the cache" in p.stderr, p
        copies = {p.name.split("-", 1)[1] for p in data_files(cache)}
        assert copies == {"a.jsonl.zst.data", "c.jsonl.zst.data"}, copies
        # An entry alone over the cap is refused with a clear message.
        d5 = daemon(text_conf(tmp_path / "tiny", {"a": [paths["a"]]}, f"cache_max_bytes = {entry // 2}\n"))
        p = d5.dump("a", tmp_path / "a5", batches=1, check=False)
        assert not isinstance(p, dict) and "would pass cache_max_bytes" in p.stderr, p
    assert 0 < peak[0] <= cap, f"cache_dir held {peak[0]} bytes, cap {cap}"
