# SPDX-License-Identifier: MIT
"""Text feeds end to end: JSONL and plain text, plain and compressed, tokenized
by a real feedd with a real tokenizer (cl100k_base), checked against tiktoken
(npm, the reference encoder) through the independent contract reference
tests/ref/feed_ref.py; `feedctl prep` output served as Megatron shards must
give the same stream; bad records, truncated streams and the index cache.

Needs the tokenizer data that scripts/test.sh fetches (build/tokdata); skips
without it. Runs with Debian's /usr/bin/python3.
"""

import gzip
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, FEEDCTL, SRC, assert_batches_equal, feed_ref

TOKDATA = BUILD / "tokdata"
RANKS = TOKDATA / "ranks" / "cl100k_base.tiktoken"
EOT = 100257  # <|endoftext|> in cl100k_base

pytestmark = pytest.mark.skipif(
    not RANKS.exists() or not (TOKDATA / "node_modules" / "tiktoken").exists() or not shutil.which("node")
    or not shutil.which("zstd"),
    reason="tokenizer data (scripts/fetch-tok-data.sh), node or zstd missing")


def tiktoken_ids(texts, tmp):
    """encode_ordinary of each text with npm tiktoken."""
    src, out = tmp / "texts.json", tmp / "ids.json"
    src.write_text(json.dumps(texts))
    subprocess.run(["node", str(SRC / "tests" / "integration" / "encode_docs.mjs"), str(TOKDATA), "cl100k_base",
                    str(src), str(out)], check=True, timeout=300)
    return [np.array(ids, np.int64) for ids in json.loads(out.read_text())]


class TextShard:
    """A reference shard of already tokenized documents (feed_ref.RankStream's shard interface)."""

    def __init__(self, docs):
        self.docs = len(docs)
        self._tokens = docs
        self.doc_lens = np.array([len(d) for d in docs], np.int64)

    def doc_tokens(self, d):
        return self._tokens[d]


def record_text(line, key="text"):
    """What a text feed takes from a JSONL line, the Python way; None for a bad record."""
    try:
        v = json.loads(line.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    if not isinstance(v, dict) or not isinstance(v.get(key), str):
        return None
    return v[key]


def paragraphs():
    text = (TOKDATA / "corpus-small.txt").read_text(encoding="utf-8", errors="replace")
    return [p for p in text.split("\n\n") if p.strip()]


EDGE = [
    "Grüße aus Köln — naïve café, Ångström",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 👩‍👩‍👧‍👦 and flags 🇩🇪🇯🇵 and skin tones 👍🏽",
    "<|endoftext|> is ordinary text here, as are <|fim_prefix|> and <|im_start|>",
    "   leading and trailing spaces   \n\n\n\t\ttabs\r\nwindows line ends\r\n",
    "digits 1234567890 3.14159 1e-9 0x7fff",
    "NUL inside \u0000 the text",
    "",
    "don't won't I'm you're they've we'll he'd",
    "x" * 50000,
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three JSONL shards (plain, gzip, zstd of two concatenated frames) with their reference tokens."""
    d = tmp_path_factory.mktemp("text")
    paras = paragraphs()
    docs = EDGE + paras[:1200]
    lines = [json.dumps({"id": i, "text": t}).encode() for i, t in enumerate(docs)]
    # Invalid UTF-8 inside a string: replaced by U+FFFD the way Python's errors="replace" does.
    lines.insert(3, b'{"text": "bad \xff\xfe bytes \xc3 and \xe2\x82 cut"}')
    parts = [lines[:400], lines[400:800], lines[800:]]
    (d / "a.jsonl").write_bytes(b"\n".join(parts[0]) + b"\n\n   \n")  # blank lines are not documents
    with gzip.open(d / "b.jsonl.gz", "wb") as f:
        f.write(b"\n".join(parts[1]) + b"\n")
    half = len(parts[2]) // 2
    for i, chunk in enumerate((parts[2][:half], parts[2][half:])):
        (d / f"c{i}.jsonl").write_bytes(b"\n".join(chunk) + (b"\n" if i == 0 else b""))  # last line unterminated
        subprocess.run(["zstd", "-q", "-f", str(d / f"c{i}.jsonl"), "-o", str(d / f"c{i}.zst")], check=True)
    (d / "c.jsonl.zst").write_bytes((d / "c0.zst").read_bytes() + (d / "c1.zst").read_bytes())
    for p in ("c0.jsonl", "c1.jsonl", "c0.zst", "c1.zst"):
        (d / p).unlink()
    texts = [[record_text(l) for l in part] for part in parts]
    flat = [t for part in texts for t in part]
    ids = iter(tiktoken_ids(flat, d))
    shards = [TextShard([next(ids) for _ in part]) for part in texts]
    return {"dir": d, "shards": shards, "paths": [d / "a.jsonl", d / "b.jsonl.gz", d / "c.jsonl.zst"]}


def shard_lines(paths):
    """A shards list, one path per indented line (an INI line holds at most 198 bytes)."""
    return ",\n  ".join(map(str, paths))


def text_conf(name, paths, cache, fmt="jsonl", seq_len=256, batch_size=4, seed=11, shuffle="true", window=2,
              bos="none", eos="<|endoftext|>", extra=""):
    return (f"[feedd]\ncache_dir = {cache}\n[feed.{name}]\nformat = {fmt}\nshards = {shard_lines(paths)}\n"
            f"tokenizer = {RANKS}\ntokenizer_preset = cl100k_base\nseq_len = {seq_len}\nbatch_size = {batch_size}\n"
            f"seed = {seed}\nshuffle = {shuffle}\nshuffle_window = {window}\nbos = {bos}\neos = {eos}\n{extra}")


def ref_batches(shards, rank, world, n, seq_len=256, batch_size=4, seed=11, shuffle=True, window=2, bos=None,
                eos=EOT, start=0):
    rs = feed_ref.RankStream(shards, seed, shuffle, window, world, rank, bos=bos, eos=eos)
    return list(rs.batches(seq_len, batch_size, start_batch=start, count=n))


@pytest.mark.parametrize("world,rank,shuffle,bos", [(2, 1, True, None), (1, 0, False, 100258), (3, 0, True, None)])
def test_jsonl_feed_equals_tiktoken_through_the_contract(daemon, corpus, tmp_path, world, rank, shuffle, bos):
    d = daemon(text_conf("web", corpus["paths"], tmp_path / "cache", shuffle="true" if shuffle else "false",
                         bos="none" if bos is None else bos))
    n = 80
    got = d.dump("web", tmp_path / "out", rank=rank, world=world, batches=n)
    assert_batches_equal(got, ref_batches(corpus["shards"], rank, world, n, shuffle=shuffle, bos=bos))
    st = next(f for f in d.status()["feeds"] if f["name"] == "web")
    assert st["documents"] == sum(s.docs for s in corpus["shards"])
    assert st["eos"] == EOT
    assert st["text"]["utf8_replaced"] >= 1 and st["text"]["bad_records"] == 0


@pytest.mark.parametrize("world,rank", [(2, 1), (3, 0)])
def test_jsonl_feed_with_the_default_virtual_ranks_equals_the_contract(daemon, corpus, tmp_path, world, rank):
    """feedd's default virtual_ranks (1024, section 17): V' = min(1024, documents) one-row streams in rotation."""
    d = daemon(text_conf("web", corpus["paths"], tmp_path / "cache", extra="# virtual_ranks: feedd's default\n"))
    n = 40
    got = d.dump("web", tmp_path / "out", rank=rank, world=world, batches=n)
    vp = feed_ref.effective_vranks(1024, [sum(s.docs for s in corpus["shards"])])

    def rows_of(v, first_row):
        rs = feed_ref.RankStream(corpus["shards"], 11, True, 2, vp, v, eos=EOT, virtual=True)
        return rs.batches(256, 1, start_batch=first_row)

    exp = list(itertools.islice(feed_ref.virtual_batches(rows_of, feed_ref.virtual_streams(vp, world, rank), 4, 256),
                                n))
    assert_batches_equal(got, exp)
    assert got["cursors"][-1].startswith("fv1")


def test_resume_from_a_cursor_inside_a_document(daemon, corpus, tmp_path):
    d = daemon(text_conf("web", corpus["paths"], tmp_path / "cache", seq_len=128, batch_size=2))
    full = d.dump("web", tmp_path / "full", rank=0, world=2, batches=60)
    cur = full["cursors"][29]
    offset = int(cur.split("-")[9], 16)
    assert offset > 0, "the test wants a cursor in the middle of a document"
    part = d.dump("web", tmp_path / "part", rank=0, world=2, batches=30, cursor=cur)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(part[k], full[k][30:]), k


def test_prep_output_serves_the_same_stream(daemon, corpus, tmp_path):
    """feedctl prep (offline) and the text feed (online) tokenize identically, document for document."""
    prefixes = []
    for i, p in enumerate(corpus["paths"]):
        prefix = tmp_path / f"prep{i}"
        r = subprocess.run([str(FEEDCTL), "prep", "--tokenizer", str(RANKS), "--preset", "cl100k_base", "--out",
                            str(prefix), "--threads", "2", str(p)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "documents" in r.stderr and "tokens" in r.stderr
        prefixes.append(prefix)
    for prefix, ref in zip(prefixes, corpus["shards"]):
        shard = feed_ref.Shard(f"{prefix}.idx")
        assert shard.docs == ref.docs
        for k in range(ref.docs):
            assert np.array_equal(shard.doc_tokens(k).astype(np.int64), ref.doc_tokens(k)), f"{prefix} doc {k}"
    mega = (f"[feed.mega]\nshards = {shard_lines(f'{p}.idx' for p in prefixes)}\nseq_len = 256\nbatch_size = 4\n"
            f"seed = 11\nshuffle = true\nshuffle_window = 2\neos = {EOT}\n")
    d = daemon(text_conf("web", corpus["paths"], tmp_path / "cache") + mega)
    a = d.dump("web", tmp_path / "a", rank=1, world=2, batches=40)
    b = d.dump("mega", tmp_path / "b", rank=1, world=2, batches=40)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(a[k], b[k]), k


def test_plain_text_files_are_one_document_each(daemon, corpus, tmp_path):
    paras = paragraphs()[:40]
    paths = []
    for i, t in enumerate(paras):
        p = tmp_path / f"doc{i:02d}.txt"
        p.write_text(t + "\n")
        if i % 3 == 0:
            subprocess.run(["zstd", "-q", "--rm", str(p)], check=True)
            p = Path(str(p) + ".zst")
        paths.append(p)
    ids = tiktoken_ids([t + "\n" for t in paras], tmp_path)
    shards = [TextShard([x]) for x in ids]
    d = daemon(text_conf("books", paths, tmp_path / "cache", fmt="text", seq_len=64, batch_size=2, window=3))
    got = d.dump("books", tmp_path / "out", rank=0, world=1, batches=50)
    assert_batches_equal(got, ref_batches(shards, 0, 1, 50, seq_len=64, batch_size=2, window=3))


BAD = [
    (b'{"text": "fine 1"}', None),
    (b'{"text": "cut off', "not valid JSON"),
    (b'["text", "an array"]', "not a JSON object"),
    (b'{"body": "no text member"}', 'no "text" member'),
    (b'{"text": 42}', "not a string"),
    (b'{"text": "fine 2"}', None),
]


def bad_shard(tmp):
    good = [json.dumps({"text": t}).encode() for t in paragraphs()[:60]]
    lines = good[:10] + [l for l, _ in BAD] + good[10:]
    p = tmp / "bad.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    texts = [record_text(l) for l in lines]
    ids = tiktoken_ids([t or "" for t in texts], tmp)
    return p, TextShard([x if t is not None else np.zeros(0, np.int64) for t, x in zip(texts, ids)])


def test_bad_records_are_skipped_counted_and_keep_the_order(daemon, tmp_path):
    p, ref = bad_shard(tmp_path)
    d = daemon(text_conf("b", [p], tmp_path / "cache", seq_len=64, batch_size=2, shuffle="false",
                         extra="max_bad_fraction = 0.2\n"))
    # Rank 1 of 2: skipped records still count in k mod R, so rank 1 gets the same documents as with them empty.
    got = d.dump("b", tmp_path / "out", rank=1, world=2, batches=30)
    assert_batches_equal(got, ref_batches([ref], 1, 2, 30, seq_len=64, batch_size=2, shuffle=False))
    got0 = d.dump("b", tmp_path / "out0", rank=0, world=2, batches=30)
    assert_batches_equal(got0, ref_batches([ref], 0, 2, 30, seq_len=64, batch_size=2, shuffle=False))
    st = next(f for f in d.status()["feeds"] if f["name"] == "b")
    assert st["state"] == "ready"
    assert st["text"]["bad_records"] == 4
    log = d.log_text()
    for i, (_, why) in enumerate(BAD):
        if why:
            assert f"bad.jsonl:{11 + i}:" in log and why in log, (why, log)


def test_bad_record_with_fail_policy_names_file_and_line(daemon, tmp_path):
    p, _ = bad_shard(tmp_path)
    d = daemon(text_conf("b", [p], tmp_path / "cache", seq_len=64, batch_size=2, shuffle="false",
                         extra="on_bad_record = fail\n"))
    r = d.dump("b", tmp_path / "out", rank=0, world=1, batches=30, check=False)
    assert r.returncode != 0
    assert "bad.jsonl:12:" in r.stderr and "not valid JSON" in r.stderr, r.stderr


def test_too_many_bad_records_fail_the_feed(daemon, tmp_path):
    p, _ = bad_shard(tmp_path)
    d = daemon(text_conf("b", [p], tmp_path / "cache", seq_len=64, batch_size=2, shuffle="false"))
    r = d.dump("b", tmp_path / "out", rank=0, world=1, batches=30, check=False)
    assert r.returncode != 0 and "max_bad_fraction" in r.stderr, r.stderr
    st = next(f for f in d.status()["feeds"] if f["name"] == "b")
    assert st["state"] == "failed" and "max_bad_fraction" in st["error"]


def test_truncated_compressed_shards(daemon, tmp_path):
    lines = [json.dumps({"text": t}).encode() for t in paragraphs()[:300]]
    whole = gzip.compress(b"\n".join(lines) + b"\n")
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) * 2 // 3])
    # zstd decodes whole blocks (up to 128 KiB): make several, so a cut leaves whole ones.
    raw = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in paragraphs()[:2400])
    (tmp_path / "whole.jsonl").write_bytes(raw)
    subprocess.run(["zstd", "-q", "-f", str(tmp_path / "whole.jsonl"), "-o", str(tmp_path / "z.zst")], check=True)
    z = (tmp_path / "z.zst").read_bytes()
    (tmp_path / "cut.jsonl.zst").write_bytes(z[:len(z) // 2])
    lenient = "max_bad_fraction = 0.05\n"
    conf = (text_conf("gz", [tmp_path / "cut.jsonl.gz"], tmp_path / "cache", seq_len=64, batch_size=2, extra=lenient)
            + text_conf("zs", [tmp_path / "cut.jsonl.zst"], tmp_path / "cache", seq_len=64, batch_size=2,
                        extra=lenient).split("\n", 2)[2]
            + text_conf("strict", [tmp_path / "cut.jsonl.gz"], tmp_path / "cache", seq_len=64, batch_size=2,
                        extra="on_bad_record = fail\n").split("\n", 2)[2])
    d = daemon(conf)
    feeds = {f["name"]: f for f in d.status()["feeds"]}
    for name in ("gz", "zs"):
        f = feeds[name]
        assert f["state"] == "ready", (name, f["error"])
        assert 0 < f["documents"] < (300 if name == "gz" else 2400)
        assert f["text"]["bad_records"] == 1 and "truncated" in f["text"]["last_bad_record"]
        d.dump(name, tmp_path / f"out-{name}", rank=0, world=1, batches=5)
    assert feeds["strict"]["state"] == "failed"
    assert "cut.jsonl.gz" in feeds["strict"]["error"] and "truncated" in feeds["strict"]["error"]


def test_index_cache_is_reused_and_rebuilt_when_a_shard_changes(daemon, corpus, tmp_path):
    cache = tmp_path / "cache"
    paths = [tmp_path / "x.jsonl", tmp_path / "y.jsonl.gz"]
    shutil.copy(corpus["paths"][0], paths[0])
    shutil.copy(corpus["paths"][1], paths[1])
    conf = text_conf("web", paths, cache)

    def work(d):
        return next(f for f in d.status()["feeds"] if f["name"] == "web")

    # Shards are indexed when their window comes up (issue #22): after the batches, both were.
    d = daemon(conf)
    before = d.dump("web", tmp_path / "a", rank=0, world=1, batches=10)
    wa = work(d)["work_ahead"]
    assert (wa["text_shards_indexed"], wa["text_shards_pending"], wa["text_indexes_from_cache"]) == (2, 0, 0), wa
    d.stop()
    d = daemon(conf)
    again = d.dump("web", tmp_path / "b", rank=0, world=1, batches=10)
    assert np.array_equal(before["input_ids"], again["input_ids"])
    st = work(d)
    assert st["work_ahead"]["text_indexes_from_cache"] == 2, st["work_ahead"]
    docs = st["documents"]
    d.stop()
    with open(paths[0], "ab") as f:
        f.write(json.dumps({"text": "one more document"}).encode() + b"\n")
    time.sleep(0.01)
    d = daemon(conf)
    d.dump("web", tmp_path / "c", rank=0, world=1, batches=10)
    st = work(d)
    assert st["work_ahead"]["text_indexes_from_cache"] == 1, st["work_ahead"]
    assert st["documents"] == docs + 1


def test_token_count_is_known_once_every_document_was_tokenized(daemon, corpus, tmp_path):
    """A text feed's tokens are unknown at load (0): counted once per document as workers tokenize them,
    whatever the epoch or rank, and shown in status once every document has been (length schedules)."""
    d = daemon(text_conf("web", corpus["paths"], tmp_path / "cache", seq_len=1024, batch_size=8))
    st = next(f for f in d.status()["feeds"] if f["name"] == "web")
    assert st["tokens"] == 0
    total = sum(int(np.sum(s.doc_lens)) for s in corpus["shards"])
    positions = total + sum(int(np.count_nonzero(s.doc_lens)) for s in corpus["shards"])  # + eos
    d.dump("web", tmp_path / "out", batches=positions // (1024 * 8) + 2)  # past the end of epoch 0
    st = next(f for f in d.status()["feeds"] if f["name"] == "web")
    assert st["tokens"] == total, (st["tokens"], total)
