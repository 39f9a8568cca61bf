#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Self-check of the sample-order reference (tests/ref/feed_ref.py).

Runs with Debian's /usr/bin/python3 and python3-pytest, python3-numpy
(python3-torch for the DataLoader baseline check, skipped without it):

    PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/integration/test_reference_selfcheck.py

The daemon is tested against feed_ref, so feed_ref itself is tested here
against a deliberately naive implementation: .idx parsed with struct, one
Python step per token, every output field built by the literal rule of the
contract. Shards are small and mix dtypes, empty documents (both on-disk
forms), multi-sequence documents and shards of different sizes, so streams run
across several epochs and ranks.
"""

import importlib.util
import itertools
import os
import struct
import sys
import time

import numpy as np
import pytest

sys.dont_write_bytecode = True  # keep __pycache__ out of scripts/ and tests/ref/
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, rel):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, rel))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fr = _load("feed_ref", "tests/ref/feed_ref.py")
gen = _load("gen_megatron", "scripts/gen_megatron.py")

M64 = (1 << 64) - 1


# --------------------------------------------------------------------------
# The naive implementation: literal, per token, shares no code with feed_ref.

def naive_read_shard(idx_path):
    """Documents of a shard as lists of Python ints, parsed with struct."""
    raw = open(idx_path, "rb").read()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, nseq, ndoc = struct.unpack_from("<QBQQ", raw, 9)
    assert version == 1
    fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}[code]
    size = struct.calcsize(fmt)
    off = 34
    lengths = struct.unpack_from(f"<{nseq}i", raw, off)
    pointers = struct.unpack_from(f"<{nseq}q", raw, off + 4 * nseq)
    doc_idx = struct.unpack_from(f"<{ndoc}q", raw, off + 12 * nseq)
    data = open(idx_path[:-4] + ".bin", "rb").read()
    docs = []
    for d in range(ndoc - 1):
        toks = []
        for s in range(doc_idx[d], doc_idx[d + 1]):
            for i in range(lengths[s]):
                toks.append(struct.unpack_from("<" + fmt, data, pointers[s] + i * size)[0])
        docs.append(toks)
    return docs


def naive_mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return x


def naive_shuffle(a, key):
    c = 0
    for i in range(len(a) - 1, 0, -1):
        c += 1
        j = naive_mix((key + c * 0x9E3779B97F4A7C15) & M64) % (i + 1)
        a[i], a[j] = a[j], a[i]


def naive_epoch_order(counts, seed, shuffle, W, e):
    K = naive_mix(seed ^ naive_mix(e + 1))
    P = list(range(len(counts)))
    if shuffle:
        naive_shuffle(P, K)
    order = []
    w = 0
    while w * W < len(P):
        docs = [(s, d) for s in P[w * W:w * W + W] for d in range(counts[s])]
        if shuffle:
            naive_shuffle(docs, naive_mix(K ^ naive_mix(w + 1)))
        order += docs
        w += 1
    return order


def naive_stream(docs, seed, shuffle, W, R, r, bos, eos):
    """Yields (token, is_first_position_of_a_document, epoch) forever."""
    counts = [len(x) for x in docs]
    e = 0
    while True:
        for k, (s, d) in enumerate(naive_epoch_order(counts, seed, shuffle, W, e)):
            if k % R != r or not docs[s][d]:
                continue
            contrib = ([bos] if bos is not None else []) + docs[s][d] + \
                      ([eos] if eos is not None else [])
            for i, t in enumerate(contrib):
                yield t, i == 0, e
        e += 1


def naive_batches(docs, seed, shuffle, W, R, r, bos, eos, L, B, nbatches):
    pos = list(itertools.islice(naive_stream(docs, seed, shuffle, W, R, r, bos, eos),
                                nbatches * B * L + 1))
    out = []
    for b in range(nbatches):
        inp, lab, posid, cu = [], [], [], [0]
        for row in range(B):
            j = b * B + row
            inp.append([pos[j * L + t][0] for t in range(L)])
            lab.append([-100 if pos[j * L + t + 1][1] else pos[j * L + t + 1][0]
                        for t in range(L)])
            p = []
            for t in range(L):
                p.append(0 if t == 0 or pos[j * L + t][1] else p[-1] + 1)
            posid.append(p)
            for t in range(L):
                flat = row * L + t
                if (t == 0 or pos[j * L + t][1]) and flat not in cu:
                    cu.append(flat)
        cu.append(B * L)
        out.append({"input_ids": inp, "labels": lab, "position_ids": posid,
                    "cu_seqlens": cu, "epoch": pos[b * B * L][2]})
    return out


# --------------------------------------------------------------------------
# Fixtures

@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    """Four small shards: three generated (u16, i32, i64), one hand-made (u8)."""
    d = tmp_path_factory.mktemp("shards")
    specs = [(7, "u16", 900), (11, "i32", 50257), (4, "i64", 70000)]
    paths = []
    for i, (ndocs, dtype, vocab) in enumerate(specs):
        prefix = str(d / f"shard_{i:03d}")
        gen.generate_shard(prefix, i, ndocs, seed=5, vocab=vocab, dtype=dtype,
                           mean_len=6, empty_frac=0.2, multi_frac=0.4)
        paths.append(prefix + ".idx")
    prefix = str(d / "shard_003")
    gen.write_shard(prefix, [
        [np.array([1, 2, 3]), np.array([4])],   # two sequences
        [],                                     # empty: doc_idx[d] == doc_idx[d+1]
        [np.array([], np.int64)],               # empty: one zero-length sequence
        [np.array([255])],
        [np.array([7, 8]), np.array([], np.int64), np.array([9])],
    ], "u8")
    paths.append(prefix + ".idx")
    return paths


@pytest.fixture(scope="module")
def naive_docs(shard_set):
    return [naive_read_shard(p) for p in shard_set]


def assert_batch_equal(got, want, where):
    for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        assert got[k].dtype == np.int32, (where, k)
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k], np.int32),
                                      err_msg=f"{where}: {k}")
    assert got["epoch"] == want["epoch"], where


# --------------------------------------------------------------------------
# Tests

def test_mix_matches_splitmix64():
    # RNG(0).next() is splitmix64 seeded with 0; these are its published outputs.
    rng = fr.Rng(0)
    assert [rng.next() for _ in range(3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    for x in (0, 1, M64, 0x123456789ABCDEF0):
        assert fr.mix(x) == naive_mix(x)


def test_shards_roundtrip(shard_set, naive_docs):
    shards = fr.load_shards(shard_set)
    assert [s.dtype.str for s in shards] == ["<u2", "<i4", "<i8", "|u1"]
    for shard, docs in zip(shards, naive_docs):
        assert shard.docs == len(docs)
        for d, toks in enumerate(docs):
            assert shard.doc_tokens(d).tolist() == toks
            assert shard.doc_lens[d] == len(toks)
    assert naive_docs[3] == [[1, 2, 3, 4], [], [], [255], [7, 8, 9]]
    # Generated shards hold both empty and multi-sequence documents.
    for s in shards[:3]:
        assert np.any(s.doc_lens == 0)
        assert np.any(np.diff(s.doc_idx) > 1)


def test_generator_format_and_determinism(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    args = ["--shards", "2", "--docs-per-shard", "300", "--seed", "9", "--mean-len", "50",
            "--empty-frac", "0.1", "--multi-seq-frac", "0.3"]
    assert gen.main([a] + args) == 0
    assert gen.main([b] + args[:1] + ["3"] + args[2:]) == 0
    for name in ("shard_000.bin", "shard_000.idx", "shard_001.bin", "shard_001.idx"):
        assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read()
    s = fr.load_shards([os.path.join(a, "shard_000.idx")])[0]
    assert s.docs == 300 and s.doc_idx[0] == 0 and s.doc_idx[-1] == len(s.seq_lens)
    assert s.pointers[0] == 0
    np.testing.assert_array_equal(np.diff(s.pointers), s.seq_lens[:-1] * 2)
    # Generated empty documents are one zero-length sequence, as Megatron writes them.
    empty = np.flatnonzero(s.doc_lens == 0)
    assert 10 < len(empty) < 60 and np.all(np.diff(s.doc_idx)[empty] == 1)
    assert 50 < np.count_nonzero(np.diff(s.doc_idx) > 1) < 140
    assert int(s.tokens.max()) < 50257
    with pytest.raises(SystemExit):
        gen.main([a, "--dtype", "u8"])  # default vocab does not fit u8


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_epoch_order_partitions_documents(shard_set, shuffle, W):
    shards = fr.load_shards(shard_set)
    counts = [s.docs for s in shards]
    every = {(s, d) for s in range(len(counts)) for d in range(counts[s])}
    for seed in (0, 1, M64):
        for e in range(3):
            order = fr.epoch_order(counts, seed, shuffle, W, e)
            assert order == naive_epoch_order(counts, seed, shuffle, W, e)
            assert len(order) == len(every) and set(order) == every
            if not shuffle:
                assert order == sorted(order)
            for R in (1, 2, 3, 4):
                per_rank = [fr.RankStream(shards, seed, shuffle, W, R, r).epoch_docs(e)
                            for r in range(R)]
                assert sorted(sum(per_rank, [])) == sorted(every)
                assert all(per_rank[r] == order[r::R] for r in range(R))
    if shuffle:
        assert fr.epoch_order(counts, 1, True, W, 0) != fr.epoch_order(counts, 1, True, W, 1)


def test_epoch_tokens_appear_once_across_ranks(tmp_path):
    # Every token of document g is g, so a stream shows which documents it holds.
    docs = [[np.full(1 + (g * 7) % 5, g)] if g % 6 else [] for g in range(1, 40)]
    gen.write_shard(str(tmp_path / "a"), docs[:17], "u16")
    gen.write_shard(str(tmp_path / "b"), docs[17:], "u16")
    shards = fr.load_shards([str(tmp_path / "a.idx"), str(tmp_path / "b.idx")])
    want = {g: 1 + (g * 7) % 5 for g in range(1, 40) if g % 6}
    for R in (1, 2, 3):
        seen = {}
        for r in range(R):
            rs = fr.RankStream(shards, 3, True, 2, R, r, bos=0)
            cur = rs.cursor()
            tokens, starts = cur.read(rs.plan(0).total)
            assert starts.sum() == len(rs.plan(0).ids)
            for g in tokens[tokens != 0].tolist():
                seen[g] = seen.get(g, 0) + 1
            assert np.all(tokens[starts] == 0)  # every document starts with its bos
        assert seen == want


@pytest.mark.parametrize("seed", [1, 2, 0xFFFFFFFFFFFFFFFF])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("W", [1, 2, 3])
def test_batches_match_naive(shard_set, naive_docs, seed, shuffle, W):
    shards = fr.load_shards(shard_set)
    tokens = sum(len(t) for docs in naive_docs for t in docs)
    for R, (bos, eos), (L, B) in zip(
            (1, 2, 3, 4, 1, 2, 3, 4),
            itertools.cycle([(None, None), (65000, None), (None, 3), (1, 2)]),
            itertools.cycle([(7, 3), (16, 2), (1, 5), (64, 1)])):
        # Enough batches to run each rank through about three epochs.
        nb = max(3, 3 * tokens // (R * L * B))
        for r in range(R):
            where = f"seed={seed} shuffle={shuffle} W={W} R={R} r={r} bos={bos} eos={eos} L={L} B={B}"
            rs = fr.RankStream(shards, seed, shuffle, W, R, r, bos=bos, eos=eos)
            got = list(rs.batches(L, B, count=nb))
            want = naive_batches(naive_docs, seed, shuffle, W, R, r, bos, eos, L, B, nb)
            for b, (g, w) in enumerate(zip(got, want)):
                assert g["batch"] == b
                assert_batch_equal(g, w, f"{where} batch {b}")
            assert got[-1]["epoch"] >= 1, where  # the check crossed an epoch boundary
            # Starting at batch k gives the tail of the batches from 0.
            for k in (1, nb // 2, nb - 1):
                tail = list(fr.RankStream(shards, seed, shuffle, W, R, r, bos=bos, eos=eos)
                            .batches(L, B, start_batch=k, count=nb - k))
                for b, g in enumerate(tail, k):
                    assert g["batch"] == b
                    assert_batch_equal(g, got[b], f"{where} start {k} batch {b}")


def test_attach_needs_enough_nonempty_documents(tmp_path):
    gen.write_shard(str(tmp_path / "s"), [[[1, 2]], [], [[3]], [[]], [[4, 5, 6]]], "u16")
    shards = fr.load_shards([str(tmp_path / "s.idx")])
    fr.RankStream(shards, 1, True, 1, 3, 2)
    with pytest.raises(ValueError, match="3 non-empty documents"):
        fr.RankStream(shards, 1, True, 1, 4, 0)
    with pytest.raises(ValueError):
        fr.RankStream([], 1, True, 1, 1, 0)
    # Unshuffled, rank 1 of 2 gets documents 1 and 3, both empty, in every
    # epoch: the reference refuses rather than spin (the spec leaves it open).
    rs = fr.RankStream(shards, 1, False, 1, 2, 1)
    with pytest.raises(RuntimeError, match="only empty documents"):
        next(rs.batches(4, 1))


def test_rejects_bad_idx(tmp_path):
    p = str(tmp_path / "s")
    gen.write_shard(p, [[[1, 2, 3]]], "i32")
    raw = bytearray(open(p + ".idx", "rb").read())
    bad = dict(magic=b"X" + raw[1:], version=raw[:9] + b"\x02" + raw[10:],
               dtype=raw[:17] + b"\x07" + raw[18:], short=raw[:-1])
    for what, data in bad.items():
        open(p + ".idx", "wb").write(bytes(data))
        with pytest.raises(ValueError):
            fr.load_shards([p + ".idx"])
    open(p + ".idx", "wb").write(bytes(raw))
    open(p + ".bin", "wb").write(b"\0" * 8)  # one token short
    with pytest.raises(ValueError, match="past the end"):
        fr.load_shards([p + ".idx"])


def test_reference_speed(tmp_path):
    # ~1.2e6 tokens; 200 batches of 8 x 4096 must take seconds, not minutes.
    assert gen.main([str(tmp_path), "--shards", "4", "--docs-per-shard", "500",
                     "--multi-seq-frac", "0.2", "--empty-frac", "0.02"]) == 0
    shards = fr.load_shards(fr.expand_globs([str(tmp_path / "shard_*")]))
    rs = fr.RankStream(shards, 1, True, 2, 2, 1, bos=50256, eos=50256)
    t0 = time.perf_counter()
    batches = list(rs.batches(4096, 8, count=200))
    took = time.perf_counter() - t0
    assert took < 10, f"200 batches took {took:.1f}s"
    assert batches[-1]["epoch"] >= 5
    t0 = time.perf_counter()
    last = next(fr.RankStream(shards, 1, True, 2, 2, 1, bos=50256, eos=50256)
                .batches(4096, 8, start_batch=199))
    assert time.perf_counter() - t0 < 2
    assert_batch_equal(last, batches[199], "start 199")


def test_dataloader_baseline_matches_reference(shard_set):
    pytest.importorskip("torch")
    dl = _load("dataloader_baseline", "bench/dataloader_baseline.py")
    shards = fr.load_shards(shard_set)
    for workers in (0, 1, 2):
        for (seed, shuffle, W, R, r, bos, eos) in ((1, True, 2, 2, 1, 5, None),
                                                    (4, False, 1, 1, 0, None, 6)):
            want = list(fr.RankStream(shards, seed, shuffle, W, R, r, bos, eos)
                        .batches(5, 3, count=13))
            loader = dl.make_loader(shard_set, seed, shuffle, W, R, r, seq_len=5,
                                    batch_size=3, batches=13, workers=workers,
                                    bos=bos, eos=eos)
            got = list(loader)
            assert [g["batch"] for g in got] == list(range(13))
            for g, w in zip(got, want):
                assert_batch_equal({k: (v.numpy() if hasattr(v, "numpy") else v)
                                    for k, v in g.items()}, w,
                                   f"workers={workers} seed={seed} batch {g['batch']}")
