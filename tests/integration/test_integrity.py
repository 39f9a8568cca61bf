# SPDX-License-Identifier: MIT
"""Never a wrong token (issue #16, part A): a shard rewritten in place while
clients stream is caught before any batch built from its new bytes is
delivered, the error names the file, and cursors taken before the change are
refused with "the data changed".

A real feedd serves two feeds over the same bytes: `live` over shards that
the test overwrites (same size, other bytes; with and without the old mtime
put back, as `touch -r`, `cp -p` or `rsync -t` would), and `ref` over an
untouched copy. Clients are tests/integration/stream-client (libfeed); each
batch `live` delivers must hash the same as the batch of the same index of
`ref`'s stream: the stream only depends on document lengths and the order
parameters, not on paths.

On main these fail: batches packed before the once-a-second check saw the
change were still delivered (a hash differs), and with the mtime restored a
resume from an old cursor succeeded on the new data.
"""

import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import feed_conf, gen_megatron

N = 4000  # batches a client asks for: far more than it can take before the change


def batches(text):
    """{index: hash} and the cursors, in order, of the batch lines a stream-client printed."""
    got, cursors = {}, []
    for line in text.splitlines():
        if line.startswith("batch "):
            _, index, _, h, cursor = line.split()
            got[int(index)] = h
            cursors.append(cursor)
    return got, cursors


class Reader:
    """A stream-client whose output is read as it comes."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = []
        self.t = threading.Thread(target=self._pump, daemon=True)
        self.t.start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_batches(self, n, timeout=30):
        deadline = time.time() + timeout
        while sum(l.startswith("batch ") for l in self.lines) < n:
            assert self.proc.poll() is None or self.t.is_alive(), "".join(self.lines) + self.proc.stderr.read()
            assert time.time() < deadline, f"fewer than {n} batches within {timeout} s"
            time.sleep(0.002)

    def finish(self, timeout=60):
        self.proc.wait(timeout=timeout)
        self.t.join(timeout=10)
        return "".join(self.lines), self.proc.stderr.read()


def overwrite(path, new_bytes, keep_mtime):
    st = os.stat(path)
    assert len(new_bytes) == st.st_size
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.write(new_bytes)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns


def reference_hashes(d, feed, n):
    p = d.client(feed, 0, 1, n)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return batches(out)[0]


def run_overwrite(d, feed, path, new_bytes, ref, after, sleep_ms, keep_mtime):
    r = Reader(d.client(feed, 0, 1, N, sleep_ms=sleep_ms))
    r.wait_batches(after)
    overwrite(path, new_bytes, keep_mtime)
    out, err = r.finish()
    got, cursors = batches(out)
    assert r.proc.returncode == 1 and "error" in out, f"the change was never reported:\n{out[-2000:]}\n{err}"
    wrong = [i for i, h in got.items() if ref.get(i) != h]
    assert not wrong, f"{len(wrong)} of {len(got)} delivered batches hold other bytes than the reference, " \
                      f"the first is batch {wrong[0]}"
    assert len(got) >= after
    print(f"{len(got)} batches delivered, the file overwritten after batch {after}")
    error = next(l for l in out.splitlines() if l.startswith("error"))
    assert str(path) in error and "changed while serving" in error, error
    return cursors


def assert_old_cursor_refused(d, feed, cursor):
    d.ctl("reload")
    p = d.client(feed, 0, 1, 1, cursor=cursor)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "batch " not in out, out
    assert f"the data of feed {feed} changed" in err or f"version of feed {feed}" in err and "the data changed" in err, err


@pytest.fixture(scope="module")
def megatron_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    gen_megatron.main([str(d / "orig"), "--shards", "1", "--docs-per-shard", "4000", "--mean-len", "300",
                       "--seed", "9"])
    return d / "orig"


@pytest.mark.parametrize("watch", ["auto", "inotify"])
@pytest.mark.parametrize("keep_mtime", [False, True], ids=["mtime-changed", "mtime-restored"])
@pytest.mark.parametrize("sleep_ms,after", [(10, 5), (10, 60), (0, 20), (0, 600)],
                         ids=["throttled-early", "throttled-later", "unthrottled-early", "unthrottled-later"])
def test_megatron_bin_overwritten_in_place(daemon, megatron_data, tmp_path, keep_mtime, sleep_ms, after, watch):
    """watch_changes = auto puts the file under a read lease (the test owns it); inotify is the fallback."""
    live, ref_dir = tmp_path / "live", tmp_path / "ref"
    shutil.copytree(megatron_data, live)
    shutil.copytree(megatron_data, ref_dir)
    d = daemon(f"[feedd]\nwatch_changes = {watch}\n"
               + feed_conf("live", f"{live}/shard_*.idx", seq_len=128, batch_size=2, window=1)
               + feed_conf("ref", f"{ref_dir}/shard_*.idx", seq_len=128, batch_size=2, window=1))
    ref = reference_hashes(d, "ref", N)
    bin_path = next(live.glob("*.bin"))
    rng = np.random.default_rng(after + sleep_ms)
    new = rng.integers(0, 50000, os.path.getsize(bin_path) // 2, dtype=np.uint16).tobytes()
    cursors = run_overwrite(d, "live", bin_path, new, ref, after, sleep_ms, keep_mtime)
    assert ("under read leases" if watch == "auto" else "0 under read leases") in d.log_text()
    st = next(f for f in d.status()["feeds"] if f["name"] == "live")
    assert st["state"] == "failed" and str(bin_path) in st["error"], st
    assert_old_cursor_refused(d, "live", cursors[-1])
    # The other feed, over the same bytes elsewhere, never noticed.
    assert next(f for f in d.status()["feeds"] if f["name"] == "ref")["state"] == "ready"



@pytest.mark.parametrize("watch", ["auto", "inotify"])
def test_batches_published_but_not_taken_are_withdrawn(daemon, megatron_data, tmp_path, watch):
    """A client takes one batch and sleeps while its ring fills; the .bin changes meanwhile. When it asks
    again it gets the error naming the file, not one of the batches the ring held (docs/protocol.md 7.4)."""
    live = tmp_path / "live"
    shutil.copytree(megatron_data, live)
    d = daemon(f"[feedd]\nwatch_changes = {watch}\nring_slots = 8\n"
               + feed_conf("live", f"{live}/shard_*.idx", seq_len=128, batch_size=2, window=1))
    r = Reader(d.client("live", 0, 1, 100, sleep_ms=1500))
    r.wait_batches(1)
    time.sleep(0.3)  # the ring fills behind the sleeping client
    c = d.status()["clients"][0]
    assert c["batches_published"] > c["batches_delivered"], c
    bin_path = next(live.glob("*.bin"))
    overwrite(bin_path, bytes(os.path.getsize(bin_path)), keep_mtime=True)
    out, err = r.finish()
    got, _ = batches(out)
    assert len(got) == 1, f"{len(got) - 1} batches delivered after the change:\n{out}"
    assert str(bin_path) in out.splitlines()[-1] and "changed while serving" in out, out


def wordpiece_tokenizer(path):
    """A tiny WordPiece tokenizer.json (a letter per token): enough to turn text into ids."""
    import json
    vocab = {"[UNK]": 0}
    for prefix in ("", "##"):
        for c in "abcdefghijklmnopqrstuvwxyz":
            vocab[prefix + c] = len(vocab)
    path.write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}}))


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["mtime-changed", "mtime-restored"])
@pytest.mark.parametrize("sleep_ms", [10, 0], ids=["throttled", "unthrottled"])
def test_jsonl_shard_overwritten_in_place(daemon, tmp_path, keep_mtime, sleep_ms):
    import json
    rng = np.random.default_rng(3)
    letters = np.array(list("abcdefghij"))
    lines = [json.dumps({"text": " ".join("".join(rng.choice(letters, rng.integers(1, 9)))
                                          for _ in range(rng.integers(5, 60)))}) for _ in range(6000)]
    text = ("\n".join(lines) + "\n").encode()
    for name in ("live", "ref"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.jsonl").write_bytes(text)
    tok = tmp_path / "tokenizer.json"
    wordpiece_tokenizer(tok)
    conf = f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n"
    for name in ("live", "ref"):
        conf += (f"[feed.{name}]\nformat = jsonl\nshards = {tmp_path / name}/a.jsonl\ntokenizer = {tok}\n"
                 "seq_len = 64\nbatch_size = 2\nseed = 5\nshuffle = true\nshuffle_window = 1\n")
    d = daemon(conf)
    ref = reference_hashes(d, "ref", N)
    # Other letters, same lengths: every line keeps its place, every token changes.
    new = text.translate(bytes.maketrans(b"abcdefghij", b"bcdefghija"))
    cursors = run_overwrite(d, "live", tmp_path / "live" / "a.jsonl", new, ref, 30, sleep_ms, keep_mtime)
    assert_old_cursor_refused(d, "live", cursors[-1])


def test_a_text_index_is_not_reused_for_a_shard_rewritten_with_its_old_mtime(daemon, tmp_path):
    """The cached line index of a JSONL shard is keyed by size, inode and mtime, and its check by ctime:
    a shard rewritten in place with other line breaks, the same size and its old mtime is indexed again."""
    import json
    rng = np.random.default_rng(8)
    letters = np.array(list("abcdefghij"))

    def corpus(n_lines):
        return [json.dumps({"text": " ".join("".join(rng.choice(letters, rng.integers(1, 9)))
                                              for _ in range(rng.integers(3, 30)))}) for _ in range(n_lines)]
    old = ("\n".join(corpus(800)) + "\n").encode()
    new = ("\n".join(corpus(1200)) + "\n").encode()
    new = new[:len(old)] if len(new) >= len(old) else new + b" " * (len(old) - len(new))
    new = new[:new.rfind(b"\n") + 1] + b" " * (len(old) - new.rfind(b"\n") - 1)  # whole lines, then padding
    assert len(new) == len(old)
    (tmp_path / "live").mkdir()
    (tmp_path / "ref").mkdir()
    shard = tmp_path / "live" / "a.jsonl"
    shard.write_bytes(old)
    tok = tmp_path / "tokenizer.json"
    wordpiece_tokenizer(tok)

    def conf(name, path):
        return (f"[feed.{name}]\nformat = jsonl\nshards = {path}\ntokenizer = {tok}\n"
                "seq_len = 64\nbatch_size = 2\nseed = 5\nshuffle = false\non_bad_record = skip\nmax_bad_fraction = 1\n")
    cache = f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n"
    d = daemon(cache + conf("live", shard))
    d.dump("live", tmp_path / "before", batches=3)  # the index is in the cache now
    assert d.stop() == 0
    st = os.stat(shard)
    overwrite(shard, new, keep_mtime=True)
    assert os.stat(shard).st_ino == st.st_ino
    (tmp_path / "ref" / "a.jsonl").write_bytes(new)
    d = daemon(cache + conf("live", shard) + conf("ref", tmp_path / "ref" / "a.jsonl"))
    got = d.dump("live", tmp_path / "live-out", batches=40)
    want = d.dump("ref", tmp_path / "ref-out", batches=40)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], want[k]), k
    live = next(f for f in d.status()["feeds"] if f["name"] == "live")
    assert live["text"]["bad_records"] == 0, live


# ---- the .idx is mapped (MAP_SHARED): truncated or rewritten in place while served ----

BIG_DOCS = 2_200_000  # above FEED_SCAN_AT_LOAD (2^22 index entries, S + D): validated on the scanner thread


def write_u16_shard(prefix, lengths, seed=1):
    """A u16 Megatron shard, one sequence per document (as test_scale.py writes them)."""
    n = len(lengths)
    lengths = np.asarray(lengths, dtype="<i4")
    pointers = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64))) * 2
    with open(f"{prefix}.bin", "wb") as f:
        f.write(np.random.default_rng(seed).integers(0, 50000, int(lengths.sum()), dtype="<u2").tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + np.array([1], "<u8").tobytes() + bytes([8]))
        f.write(np.array([n, n + 1], "<u8").tobytes())
        f.write(lengths.tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())


@pytest.mark.parametrize("watch", ["auto", "inotify"])
@pytest.mark.parametrize("size", ["small", "big"])
def test_mapped_idx_truncated_while_served(daemon, megatron_data, tmp_path, size, watch):
    """feedd stays up: the client gets an error naming the .idx, the other feed keeps serving (no SIGBUS)."""
    live, other = tmp_path / "live", tmp_path / "other"
    live.mkdir()
    n = BIG_DOCS if size == "big" else 4000
    write_u16_shard(live / "s", np.random.default_rng(3).integers(1, 300 if size == "small" else 8, n))
    shutil.copytree(megatron_data, other)
    d = daemon(f"[feedd]\nwatch_changes = {watch}\n"
               + feed_conf("live", f"{live}/*.idx", seq_len=128, batch_size=2, window=1)
               + feed_conf("other", f"{other}/shard_*.idx", seq_len=128, batch_size=2, window=1))
    idx = live / "s.idx"
    r = Reader(d.client("live", 0, 1, N, sleep_ms=2))
    r.wait_batches(5)
    os.truncate(idx, 4096)  # the header page stays; every entry past it is gone
    out, err = r.finish()
    assert r.proc.returncode == 1, f"the change was never reported:\n{out[-2000:]}\n{err}"
    error = next(l for l in out.splitlines() if l.startswith("error"))
    assert str(idx) in error and "changed while serving" in error, error
    assert d.proc.poll() is None, f"feedd died ({d.proc.returncode}):\n{d.log_text()[-3000:]}"
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["live"]["state"] == "failed" and str(idx) in st["live"]["error"], st["live"]
    assert st["other"]["state"] == "ready", st["other"]
    got = d.dump("other", tmp_path / "out", batches=20)
    assert got["input_ids"].shape[0] == 20


def test_idx_rewritten_in_place_under_inotify_delivers_no_wrong_batch(daemon, megatron_data, tmp_path):
    """No lease: the .idx rewritten in place (same size, valid, other document boundaries) is caught by the
    check after the .bin's reads (the .idx's identity with it), before a batch laid out by it is delivered."""
    live, ref_dir = tmp_path / "live", tmp_path / "ref"
    shutil.copytree(megatron_data, live)
    shutil.copytree(megatron_data, ref_dir)
    d = daemon("[feedd]\nwatch_changes = inotify\n"
               + feed_conf("live", f"{live}/shard_*.idx", seq_len=128, batch_size=2, window=1)
               + feed_conf("ref", f"{ref_dir}/shard_*.idx", seq_len=128, batch_size=2, window=1))
    ref = reference_hashes(d, "ref", N)
    idx = next(live.glob("*.idx"))
    raw = bytearray(idx.read_bytes())
    S = int(np.frombuffer(raw, "<u8", 1, 18)[0])
    lengths = np.frombuffer(raw, "<i4", S, 34)
    new_len = np.roll(lengths, 1).astype("<i4")  # a valid index: the same tokens, cut elsewhere
    pointers = np.concatenate(([0], np.cumsum(new_len[:-1], dtype=np.int64))) * 2
    raw[34:34 + 4 * S] = new_len.tobytes()
    raw[34 + 4 * S:34 + 12 * S] = pointers.astype("<i8").tobytes()
    assert bytes(raw) != idx.read_bytes()
    run_overwrite(d, "live", idx, bytes(raw), ref, 20, 0, keep_mtime=True)
    assert d.proc.poll() is None
    assert next(f for f in d.status()["feeds"] if f["name"] == "ref")["state"] == "ready"
