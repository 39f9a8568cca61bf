#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Generates the bad-input corpus: damaged shards, broken configs, broken tokenizer files.

Usage: gen_bad.py OUTDIR

Every case is built from a valid input by one precise change, so the test
can say exactly which file and which position the error must name. Layout:

  OUTDIR/shards/CASE/s.idx, s.bin     one Megatron shard per case
  OUTDIR/conf/CASE.conf               one config per case
  OUTDIR/tok/CASE.tiktoken|.json      one tokenizer file per case

What each case must produce is written in tests/bad/test_bad.py, not here.
"""

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gen_megatron  # noqa: E402

HEADER = 34  # magic 9, version 8, dtype 1, S 8, D 8


def _docs(rng, n=6):
    """n documents of one sequence each, 5..40 tokens (u16)."""
    return [[rng.integers(1, 60000, int(rng.integers(5, 40)))] for _ in range(n)]


def _shard(d, docs, dtype="u16"):
    d.mkdir(parents=True, exist_ok=True)
    gen_megatron.write_shard(str(d / "s"), docs, dtype)
    return d / "s.idx", d / "s.bin"


def _fields(raw):
    s, dd = struct.unpack_from("<QQ", raw, 18)
    return s, dd, HEADER, HEADER + 4 * s, HEADER + 12 * s  # S, D, lengths, pointers, doc_idx offsets


def _patch(path, offset, fmt, *values):
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, offset, *values)
    path.write_bytes(bytes(raw))


def shards(out):
    rng = np.random.default_rng(8)
    base = out / "shards"

    idx, _ = _shard(base / "idx-truncated-header", _docs(rng))
    idx.write_bytes(idx.read_bytes()[:20])

    idx, _ = _shard(base / "idx-truncated-arrays", _docs(rng))
    idx.write_bytes(idx.read_bytes()[:-8])

    idx, _ = _shard(base / "bad-magic", _docs(rng))
    _patch(idx, 0, "<9s", b"NOTANIDX\0")

    idx, _ = _shard(base / "bad-version", _docs(rng))
    _patch(idx, 9, "<Q", 2)

    idx, _ = _shard(base / "unknown-dtype", _docs(rng))
    _patch(idx, 17, "<B", 99)

    idx, _ = _shard(base / "float-dtype", _docs(rng))
    _patch(idx, 17, "<B", 6)

    # .idx/.bin size mismatch: the .bin lost its last token.
    idx, binf = _shard(base / "bin-shorter-than-idx", _docs(rng))
    binf.write_bytes(binf.read_bytes()[:-2])

    # The last sequence's pointer aims past the end of the .bin.
    idx, binf = _shard(base / "pointer-past-end", _docs(rng))
    s, _, _, ptr, _ = _fields(idx.read_bytes())
    _patch(idx, ptr + 8 * (s - 1), "<q", binf.stat().st_size)

    idx, _ = _shard(base / "pointer-overlap", _docs(rng))
    s, _, _, ptr, _ = _fields(idx.read_bytes())
    _patch(idx, ptr + 8 * 3, "<q", 0)

    idx, _ = _shard(base / "negative-length", _docs(rng))
    _, _, lens, _, _ = _fields(idx.read_bytes())
    _patch(idx, lens + 4 * 2, "<i", -3)

    # doc_idx must never decrease: [0, 1, 2, 3, ...] -> [0, 1, 0, 3, ...].
    idx, _ = _shard(base / "doc-index-non-monotone", _docs(rng))
    _, _, _, _, doc = _fields(idx.read_bytes())
    _patch(idx, doc + 8 * 2, "<q", 0)

    idx, _ = _shard(base / "doc-index-short-of-s", _docs(rng))
    _, dd, _, _, doc = _fields(idx.read_bytes())
    _patch(idx, doc + 8 * (dd - 1), "<q", 2)

    idx, binf = _shard(base / "missing-bin", _docs(rng))
    binf.unlink()

    # A token that does not fit int32 (i64 shard): found when its batch is filled.
    docs = _docs(rng, 4)
    docs[2][0] = docs[2][0].astype(np.int64)
    docs[2][0][5] = 1 << 40
    _shard(base / "token-out-of-range", docs, "i64")

    _shard(base / "empty-shard", [])
    _shard(base / "only-empty-documents", [[np.array([], np.int64)], [], [np.array([], np.int64)]])
    # Zero-length documents among good ones: skipped, and counted in status.
    docs = _docs(rng, 8)
    docs[1] = [np.array([], np.int64)]
    docs[4] = []
    docs[6] = [np.array([], np.int64), np.array([], np.int64)]
    _shard(base / "zero-length-documents", docs)
    # A good shard for the feeds that must keep serving, and one to shrink while serving.
    gen_megatron.main([str(base / "good"), "--shards", "2", "--docs-per-shard", "200", "--seed", "4"])
    gen_megatron.main([str(base / "shrinks"), "--shards", "1", "--docs-per-shard", "400", "--seed", "5"])


# name -> config text; the test states the line and the message each must produce.
CONFIGS = {
    "unknown-key-daemon": "[feedd]\nthreads = 2\nbogus = 1\n",
    "unknown-key-feed": "[feed.web]\nshards = {good}\nseqlen = 128\n",
    "unknown-section": "[feedd]\nthreads = 2\n[fed.web]\nshards = {good}\n",
    "bad-integer": "[feed.web]\nshards = {good}\nseq_len = 12abc\n",
    "zero-batch-size": "[feed.web]\nshards = {good}\nbatch_size = 0\n",
    "negative-integer": "[feedd]\nthreads = -1\n",
    "bad-bool": "[feed.web]\nshards = {good}\nshuffle = maybe\n",
    "bad-token": "[feed.web]\nshards = {good}\neos = 1e5\n",
    "bad-io-engine": "[feedd]\nio_engine = aio\n",
    "repeated-key": "[feed.web]\nshards = {good}\nseq_len = 128\nseq_len = 256\n",
    "bad-feed-name": "[feed.a/b]\nshards = {good}\n",
    "missing-shards": "[feed.web]\nseq_len = 128\n",
    "not-ini": "this is not a config\n",
    "bad-format": "[feed.web]\nshards = {good}\nformat = orc\n",
    "bad-packing": "[feed.web]\nshards = {good}\npacking = firstfit\n",
    "bad-pack-buffer": "[feed.web]\nshards = {good}\npacking = bestfit\npack_buffer = 0\n",
    "pack-buffer-without-bestfit": "[feed.web]\nshards = {good}\npacking = pad\npack_buffer = 4096\n",
    "bad-pad-id": "[feed.web]\nshards = {good}\npacking = pad\npad_id = -1\n",
    "bad-weight": "[feed.mix]\nsources = web:0.7, code:-0.3\n[feed.mix.web]\nshards = {good}\n",
    "undefined-source": "[feed.mix]\nseq_len = 128\nsources = web:0.7, code:0.3\n[feed.mix.web]\nshards = {good}\n",
    "order-key-in-source": "[feed.mix]\nsources = web:1\n[feed.mix.web]\nshards = {good}\nseq_len = 64\n",
    "shards-in-mixture": "[feed.mix]\nsources = web:1\nshards = {good}\n[feed.mix.web]\nshards = {good}\n",
}


def configs(out):
    d = out / "conf"
    d.mkdir(parents=True, exist_ok=True)
    good = f"{out}/shards/good/shard_*.idx"
    for name, text in CONFIGS.items():
        (d / f"{name}.conf").write_text(text.replace("{good}", good))


def _b64(b):
    import base64
    return base64.b64encode(b).decode()


def tokenizers(out):
    d = out / "tok"
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"{_b64(bytes([b]))} {b}" for b in range(256)]
    good = lines + [f"{_b64(b'ab')} 256"]
    (d / "good.tiktoken").write_text("\n".join(good) + "\n")
    bad = list(good)
    bad.insert(100, "this-is-not-base64!! 9999")  # line 101
    (d / "bad-line.tiktoken").write_text("\n".join(bad) + "\n")
    bad = list(good)
    bad[40] = f"{_b64(b'x')} forty"  # line 41
    (d / "bad-rank.tiktoken").write_text("\n".join(bad) + "\n")
    (d / "missing-bytes.tiktoken").write_text("\n".join(lines[:200]) + "\n")
    # WordPiece and Unigram load; these two are broken, WordLevel is not implemented.
    (d / "wordpiece.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"a": 1}}}))
    (d / "unigram.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "Unigram", "vocab": [["a", -1.0]]}}))
    (d / "wordlevel.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "WordLevel", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}}}))
    (d / "broken.json").write_text('{"model": {\n  "type": "BPE",,\n}')


def main(argv):
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    shards(out)
    configs(out)
    tokenizers(out)


if __name__ == "__main__":
    main(sys.argv[1:])
