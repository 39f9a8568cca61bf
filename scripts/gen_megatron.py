#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Deterministic generator of Megatron indexed datasets (format version 1).

Runs with Debian's /usr/bin/python3 and python3-numpy.

    gen_megatron.py OUTDIR [--shards 4] [--docs-per-shard 1000] [--seed 1]
                    [--vocab 50257] [--dtype u16] [--mean-len 600]
                    [--empty-frac 0.0] [--multi-seq-frac 0.0] [--prefix shard_]

writes OUTDIR/shard_000.bin/.idx ... and prints a one-line summary.

Shard i is generated from the RNG stream (seed, i) alone, so it is byte-for-byte
the same whatever --shards says: a 2-shard and a 4-shard run share their first
two shards. Document lengths are lognormal around --mean-len (sigma 1, a long
tail like real corpora), clipped to [1, 64 * mean]; token ids are uniform in
[0, vocab).

Importable: write_shard(prefix, docs, dtype) writes hand-made shards for tests.

On-disk layout (all little-endian):
  .idx  magic "MMIDIDX\\0\\0" (9 bytes), u64 version = 1, u8 dtype code,
        u64 S (sequences), u64 D (document-index entries = documents + 1),
        i32 lengths[S], i64 byte pointers[S] into .bin, i64 doc_idx[D]
  .bin  the tokens of all sequences back to back
Document d is sequences doc_idx[d] .. doc_idx[d+1]-1.
"""

import argparse
import os
import sys
import time

import numpy as np

IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_VERSION = 1

# Megatron's dtype codes. 6 (f64) and 7 (f32) exist in the format but are not
# token types, so this generator does not write them.
DTYPE_CODES = {
    "u8": (1, np.dtype("u1")),
    "i8": (2, np.dtype("i1")),
    "i16": (3, np.dtype("<i2")),
    "i32": (4, np.dtype("<i4")),
    "i64": (5, np.dtype("<i8")),
    "u16": (8, np.dtype("<u2")),
}


def _dtype_code(dtype):
    """Return (code, little-endian numpy dtype) for a name ('u16') or numpy dtype."""
    if isinstance(dtype, str) and dtype in DTYPE_CODES:
        return DTYPE_CODES[dtype]
    want = np.dtype(dtype).newbyteorder("<")
    for code, dt in DTYPE_CODES.values():
        if dt == want:
            return code, dt
    raise ValueError(f"unsupported token dtype {dtype!r} (want one of {sorted(DTYPE_CODES)})")


def _write_idx(path, code, lengths, pointers, doc_idx):
    with open(path, "wb") as f:
        f.write(IDX_MAGIC)
        f.write(np.array([IDX_VERSION], "<u8").tobytes())
        f.write(np.array([code], "u1").tobytes())
        f.write(np.array([len(lengths), len(doc_idx)], "<u8").tobytes())
        f.write(np.asarray(lengths, "<i4").tobytes())
        f.write(np.asarray(pointers, "<i8").tobytes())
        f.write(np.asarray(doc_idx, "<i8").tobytes())


def _pointers(lengths, itemsize):
    """Cumulative byte offsets: pointer[0] = 0, pointer[i+1] = pointer[i] + len[i]*itemsize."""
    ptr = np.zeros(len(lengths), np.int64)
    if len(lengths) > 1:
        np.cumsum(np.asarray(lengths[:-1], np.int64) * itemsize, out=ptr[1:])
    return ptr


def write_shard(prefix, docs, dtype="u16"):
    """Write PREFIX.bin and PREFIX.idx from hand-made documents.

    docs: one entry per document, each a list of sequences (array-likes of
    token ids). A document given as [] is written as doc_idx[d] == doc_idx[d+1]
    (no sequence at all); [np.array([])] is one zero-length sequence, which is
    what Megatron itself writes. dtype: a name from DTYPE_CODES or a numpy
    dtype. Token values must fit the dtype (checked, so tests fail loudly).
    """
    code, dt = _dtype_code(dtype)
    info = np.iinfo(dt)
    seqs = []
    doc_idx = [0]
    for doc in docs:
        for seq in doc:
            a = np.asarray(seq)
            if a.ndim != 1:
                raise ValueError(f"{prefix}: a sequence must be 1-D, got shape {a.shape}")
            if a.size and (a.min() < info.min or a.max() > info.max):
                raise ValueError(f"{prefix}: token outside {dt} range")
            seqs.append(a.astype(dt))
        doc_idx.append(len(seqs))
    lengths = np.array([len(s) for s in seqs], np.int64)
    tokens = np.concatenate(seqs) if seqs else np.zeros(0, dt)
    tokens.astype(dt, copy=False).tofile(prefix + ".bin")
    _write_idx(prefix + ".idx", code, lengths, _pointers(lengths, dt.itemsize), doc_idx)


def _doc_lengths(rng, n, mean_len, empty_frac):
    """Long-tailed document lengths: lognormal with the given mean, sigma 1."""
    sigma = 1.0
    mu = np.log(mean_len) - sigma * sigma / 2  # so that E[len] == mean_len
    lens = rng.lognormal(mu, sigma, n)
    lens = np.clip(np.rint(lens), 1, max(1, 64 * mean_len)).astype(np.int64)
    lens[rng.random(n) < empty_frac] = 0
    return lens


def _split_sequences(rng, doc_lens, multi_frac):
    """Return (seq_lengths, doc_idx, multi_count): each chosen doc cut into 2-4 sequences."""
    n = len(doc_lens)
    nseq = np.ones(n, np.int64)
    multi = (rng.random(n) < multi_frac) & (doc_lens >= 2)
    nseq[multi] = np.minimum(rng.integers(2, 5, n), doc_lens)[multi]
    doc_idx = np.zeros(n + 1, np.int64)
    np.cumsum(nseq, out=doc_idx[1:])
    seq_lens = np.zeros(doc_idx[-1], np.int64)
    seq_lens[doc_idx[:-1][~multi]] = doc_lens[~multi]
    # Only the multi-sequence documents need a per-document step; a fraction of
    # the docs, each a tiny sort, so generation stays vectorised in the main.
    for d in np.flatnonzero(multi):
        k = nseq[d]
        cuts = np.sort(rng.choice(doc_lens[d] - 1, k - 1, replace=False) + 1)
        edges = np.concatenate(([0], cuts, [doc_lens[d]]))
        seq_lens[doc_idx[d]:doc_idx[d + 1]] = np.diff(edges)
    return seq_lens, doc_idx, int(multi.sum())


def generate_shard(prefix, shard_index, docs, seed, vocab, dtype, mean_len,
                   empty_frac=0.0, multi_frac=0.0):
    """Generate one random shard at PREFIX.{bin,idx}; returns a stats dict."""
    code, dt = _dtype_code(dtype)
    if vocab < 1 or vocab - 1 > np.iinfo(dt).max:
        raise ValueError(f"vocab {vocab} does not fit token dtype {dt} "
                         f"(max id {np.iinfo(dt).max}); pass a smaller --vocab")
    rng = np.random.default_rng([seed, shard_index])
    doc_lens = _doc_lengths(rng, docs, mean_len, empty_frac)
    seq_lens, doc_idx, multi = _split_sequences(rng, doc_lens, multi_frac)
    total = int(doc_lens.sum())
    # Draw in the narrowest type numpy offers for the range, then store as dt.
    tokens = rng.integers(0, vocab, total, dtype=np.int64 if vocab > 2**31 else np.int32)
    tokens.astype(dt).tofile(prefix + ".bin")
    _write_idx(prefix + ".idx", code, seq_lens, _pointers(seq_lens, dt.itemsize), doc_idx)
    return {"docs": docs, "empty": int((doc_lens == 0).sum()), "multi": multi,
            "sequences": len(seq_lens), "tokens": total, "bytes": total * dt.itemsize}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--docs-per-shard", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--dtype", choices=sorted(DTYPE_CODES), default="u16")
    ap.add_argument("--mean-len", type=float, default=600)
    ap.add_argument("--empty-frac", type=float, default=0.0)
    ap.add_argument("--multi-seq-frac", type=float, default=0.0)
    ap.add_argument("--prefix", default="shard_")
    args = ap.parse_args(argv)
    if args.shards < 0 or args.docs_per_shard < 0 or args.mean_len < 1:
        ap.error("--shards and --docs-per-shard must be >= 0, --mean-len >= 1")
    if not (0 <= args.empty_frac <= 1 and 0 <= args.multi_seq_frac <= 1):
        ap.error("--empty-frac and --multi-seq-frac must be in [0, 1]")

    t0 = time.perf_counter()
    os.makedirs(args.outdir, exist_ok=True)
    tot = {"docs": 0, "empty": 0, "multi": 0, "sequences": 0, "tokens": 0, "bytes": 0}
    for i in range(args.shards):
        prefix = os.path.join(args.outdir, f"{args.prefix}{i:03d}")
        try:
            st = generate_shard(prefix, i, args.docs_per_shard, args.seed, args.vocab,
                                args.dtype, args.mean_len, args.empty_frac,
                                args.multi_seq_frac)
        except ValueError as e:
            ap.error(str(e))
        for k in tot:
            tot[k] += st[k]
    dt = time.perf_counter() - t0
    print(f"gen_megatron: {args.shards} shards in {args.outdir}: {tot['docs']} docs "
          f"({tot['empty']} empty, {tot['multi']} multi-seq), {tot['sequences']} sequences, "
          f"{tot['tokens']} tokens {args.dtype} ({tot['bytes'] / 1e6:.1f} MB), "
          f"seed {args.seed}, {dt:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
