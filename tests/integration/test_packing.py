# SPDX-License-Identifier: MIT
"""Packing modes (bestfit, pad) and mixtures, end to end: a real feedd, real
shards, batches dumped by a real client and compared with tests/ref/feed_ref.py
(docs/sample-order.md, sections 11 to 15); cursors that resume inside a
packed buffer and inside a mixture's epochs; cursors of another packing
refused; efficiency, truncation and realised proportions in the status.
And on small feeds, over many epochs:
- every cursor of a small feed resumes exactly (each batch's cursor, for
  bestfit, pad and mixtures, several ranks, over many epochs);
- fingerprints computed from docs/sample-order.md sections 8 and 15.1 alone;
- the status counters equal the reference's over many epochs;
- edge inputs: documents longer than seq_len and than the buffer, empty
  documents and empty shards, pad_id equal to real tokens, sources with too
  few documents, extreme weights and too many sources;
- configuration errors of every new key name the right line;
- a mixture's text source that is all bad records fails clearly;
- memory stays flat over many epochs of a text mixture.

Runs with Debian's /usr/bin/python3.
"""

import itertools
import json
import os
import re
import struct
import subprocess
import time

import numpy as np
import pytest

from conftest import FEEDD, assert_batches_equal, feed_conf, feed_ref, gen_megatron

L, B, SEED, EOS = 128, 4, 7, 50256


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three sources' worth of u16 shards with a wide, instruction-like length spread (many short, some > L)."""
    d = tmp_path_factory.mktemp("packing")
    for name, shards_n, mean, seed in (("web", 3, 90, 1), ("code", 2, 200, 2), ("books", 1, 400, 3)):
        gen_megatron.main([str(d / name), "--shards", str(shards_n), "--docs-per-shard", "150", "--mean-len",
                           str(mean), "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", str(seed)])
    return d


def docs(glob, rank, world, seed=SEED, shuffle=True, window=2, bos=None, eos=EOS):
    rs = feed_ref.RankStream(feed_ref.load_shards(feed_ref.expand_globs([str(glob)])), seed, shuffle, window, world,
                             rank, bos=bos, eos=eos)
    return feed_ref.rank_documents(rs)


def first(it, n):
    return list(itertools.islice(it, n))


def packed_conf(name, glob, packing, extra="", **kw):
    return feed_conf(name, glob, seq_len=L, batch_size=B, seed=SEED, eos=kw.pop("eos", EOS),
                     extra=f"packing = {packing}\n{extra}", **kw)


WEIGHTS = {"web": "0.5", "code": "0.3", "books": "0.2"}


def mixture_conf(name, shards, packing, extra=""):
    srcs = ", ".join(f"{s}:{w}" for s, w in WEIGHTS.items())
    text = (f"[feed.{name}]\nsources = {srcs}\nseq_len = {L}\nbatch_size = {B}\nseed = {SEED}\nshuffle = true\n"
            f"shuffle_window = 2\neos = {EOS}\npacking = {packing}\n{extra}")
    for s in WEIGHTS:
        text += f"[feed.{name}.{s}]\nshards = {shards}/{s}/shard_*.idx\n"
    return text


def mixture_docs(shards, rank, world):
    units = [feed_ref.mix_parse_weight(w) for w in WEIGHTS.values()]
    return feed_ref.mixed_documents([docs(f"{shards}/{s}/shard_*.idx", rank, world) for s in WEIGHTS], SEED, units)


def concat_batches(documents, n):
    """Section 14.3's "concat" over a document sequence: contributions back to back, cut per section 5."""
    toks = itertools.chain.from_iterable(((t, i == 0) for i, t in enumerate(doc.tokens.tolist())) for doc in documents)
    flat = first(toks, n * B * L + 1)
    ids = np.array([t for t, _ in flat], np.int32)
    starts = np.array([s for _, s in flat], bool)
    return [feed_ref.make_batch(ids[b * B * L:(b + 1) * B * L + 1], starts[b * B * L:(b + 1) * B * L + 1], B, L)
            for b in range(n)]


def ref(packing, documents, n, pad_id=EOS, buffer_tokens=None, start=0):
    if packing == "concat":
        return concat_batches(documents, start + n)[start:]
    if packing == "pad":
        return first(feed_ref.pad_batches(documents, L, B, pad_id), start + n)[start:]
    return first(feed_ref.bestfit_batches(documents, L, B, buffer_tokens, pad_id), start + n)[start:]


def concat_rows(documents):
    """Section 14.3's "concat" over a document sequence, one row per batch (a virtual stream's rows)."""
    toks = itertools.chain.from_iterable(((t, i == 0) for i, t in enumerate(doc.tokens.tolist())) for doc in documents)
    buf = first(toks, L + 1)
    while True:
        row = feed_ref.make_batch(np.array([t for t, _ in buf], np.int32), np.array([st for _, st in buf], bool), 1, L)
        row["epoch"] = 0  # not compared (a mixture's rows have none of the feed, section 14.3)
        yield row
        buf = buf[L:] + first(toks, L)


@pytest.mark.parametrize("packing,mixture", [("bestfit", False), ("pad", False), ("concat", True), ("bestfit", True)])
def test_the_default_virtual_ranks_match_the_contract(daemon, shards, tmp_path, packing, mixture):
    """feedd's default virtual_ranks (1024; V' = the documents of the smallest source, section 17.1): every
    virtual stream packed on its own (B = 1), a rank's batches taking rows in rotation (17.3)."""
    extra = ("pack_buffer = 300\n" if packing == "bestfit" else "") + "# virtual_ranks: feedd's default\n"
    sources = list(WEIGHTS) if mixture else ["web"]
    if mixture:
        conf = mixture_conf("v", shards, packing, extra)
    else:
        conf = packed_conf("v", f"{shards}/web/shard_*.idx", packing, extra, vranks=None)
    d = daemon(conf)
    sets = [feed_ref.load_shards(feed_ref.expand_globs([f"{shards}/{s}/shard_*.idx"])) for s in sources]
    vp = feed_ref.effective_vranks(1024, [sum(sh.docs for sh in shs) for shs in sets])
    units = [feed_ref.mix_parse_weight(w) for w in WEIGHTS.values()]

    def rows_of(v, first_row):
        streams = [feed_ref.rank_documents(feed_ref.RankStream(shs, SEED, True, 2, vp, v, eos=EOS, virtual=True))
                   for shs in sets]
        documents = feed_ref.mixed_documents(streams, SEED, units) if mixture else streams[0]
        if packing == "concat":
            rows = concat_rows(documents)
        elif packing == "pad":
            rows = feed_ref.pad_batches(documents, L, 1, EOS)
        else:
            rows = feed_ref.bestfit_batches(documents, L, 1, 300, EOS)
        return itertools.islice(rows, first_row, None)

    world, rank, n = 3, 1, 12
    got = d.dump("v", tmp_path / "out", rank=rank, world=world, batches=n)
    exp = first(feed_ref.virtual_batches(rows_of, feed_ref.virtual_streams(vp, world, rank), B, L), n)
    assert_batches_equal(got, exp)
    assert got["cursors"][-1].startswith("fv1")


@pytest.mark.parametrize("world,rank,pack_buffer", [(1, 0, 1000), (2, 1, 3 * L), (3, 2, 1)])
def test_bestfit_batches_match_the_contract(daemon, shards, tmp_path, world, rank, pack_buffer):
    glob = f"{shards}/web/shard_*.idx"
    d = daemon(packed_conf("bf", glob, "bestfit", f"pack_buffer = {pack_buffer}\npad_id = 99999\n"))
    n = 60
    got = d.dump("bf", tmp_path / "out", rank=rank, world=world, batches=n)
    exp = ref("bestfit", docs(glob, rank, world), n, pad_id=99999, buffer_tokens=pack_buffer)
    assert_batches_equal(got, exp)
    # Padding is pad_id with labels -100, and there is some: rows are whole documents.
    pads = got["input_ids"] == 99999
    assert pads.any() and (got["labels"][pads] == -100).all()


def test_pad_batches_match_the_contract_and_default_pad_id_is_eos(daemon, shards, tmp_path):
    glob = f"{shards}/books/shard_*.idx"
    d = daemon(packed_conf("pd", glob, "pad", shuffle="false"))
    got = d.dump("pd", tmp_path / "out", rank=0, world=2, batches=30)
    exp = ref("pad", docs(glob, 0, 2, shuffle=False), 30, pad_id=EOS)
    assert_batches_equal(got, exp)
    assert sum(b["truncated"] for b in exp) > 0, "the books source must have documents longer than a row"


@pytest.mark.parametrize("packing", ["concat", "bestfit", "pad"])
def test_a_mixture_of_three_sources_matches_the_contract(daemon, shards, tmp_path, packing):
    d = daemon(mixture_conf("mix", shards, packing))
    n = 40
    for rank in (0, 1):
        got = d.dump("mix", tmp_path / f"r{rank}", rank=rank, world=2, batches=n)
        exp = ref(packing, mixture_docs(shards, rank, 2), n, buffer_tokens=64 * L)
        assert_batches_equal(got, exp)
        for c in got["cursors"]:
            assert re.fullmatch(r"fc2(-[0-9a-f]+){8}(-[0-9a-f]+){9}-[0-9a-f]{16}-[0-9a-f]{8}", c), c  # data identity, check


def resumes_exactly(d, feed, tmp_path, rank, world, whole, cut):
    rest = d.dump(feed, tmp_path / f"rest{cut}", rank=rank, world=world, batches=len(whole["cursors"]) - cut - 1,
                  cursor=whole["cursors"][cut])
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(rest[k], whole[k][cut + 1:]), k
    assert rest["cursors"] == whole["cursors"][cut + 1:]


def test_bestfit_resumes_exactly_from_a_cursor_inside_a_buffer(daemon, shards, tmp_path):
    glob = f"{shards}/code/shard_*.idx"
    d = daemon(packed_conf("bf", glob, "bestfit", "pack_buffer = 2000\n"))
    whole = d.dump("bf", tmp_path / "whole", rank=1, world=2, batches=40)
    # fc1's <offset> field carries the row inside the buffer: pick cursors with row > 0 (mid-buffer).
    rows = [int(c.split("-")[8], 16) for c in whole["cursors"]]
    inside = [i for i, r in enumerate(rows[:-1]) if r > 0]
    assert len(inside) >= 3, rows
    for cut in inside[:3]:
        resumes_exactly(d, "bf", tmp_path, 1, 2, whole, cut)


def test_a_mixture_resumes_exactly_inside_its_sources_epochs(daemon, shards, tmp_path):
    for packing in ("bestfit", "concat"):
        d = daemon(mixture_conf(f"m{packing}", shards, packing, "pack_buffer = 700\n" if packing == "bestfit" else ""))
        n = 120
        whole = d.dump(f"m{packing}", tmp_path / f"whole-{packing}", rank=3, world=4, batches=n)
        # The web source has the fewest tokens: by the end it is several epochs in while the others are not.
        epochs = [int(c.split("-")[9], 16) for c in whole["cursors"]]
        cut = next(i for i in range(n - 10) if epochs[i] >= 1)
        assert epochs[cut] > int(whole["cursors"][cut].split("-")[12], 16), "sources keep their own epochs"
        resumes_exactly(d, f"m{packing}", tmp_path, 3, 4, whole, cut)
        md = mixture_docs(shards, 3, 4)
        assert_batches_equal(whole, ref(packing, md, n, buffer_tokens=700))


def test_a_cursor_of_another_packing_is_refused(daemon, shards, tmp_path):
    glob = f"{shards}/web/shard_*.idx"
    d = daemon(feed_conf("plain", glob, seq_len=L, batch_size=B, seed=SEED, eos=EOS)
               + packed_conf("bf", glob, "bestfit") + packed_conf("pd", glob, "pad"))
    plain = d.dump("plain", tmp_path / "plain", rank=0, world=1, batches=3)
    bf = d.dump("bf", tmp_path / "bf", rank=0, world=1, batches=3)
    for feed, cursor in (("bf", plain["cursors"][1]), ("plain", bf["cursors"][1]), ("pd", bf["cursors"][1])):
        p = d.dump(feed, tmp_path / f"x-{feed}", rank=0, world=1, batches=1, cursor=cursor, check=False)
        assert p.returncode != 0
        assert f"cursor belongs to another feed or another version of feed {feed}" in p.stderr, p.stderr
    status = {f["name"]: f for f in d.status()["feeds"]}
    # concat's fingerprint is the stream's own (cursors saved before packing existed stay valid).
    assert status["plain"]["fingerprint"] == plain["cursors"][0].split("-")[1]
    assert len({status[f]["fingerprint"] for f in ("plain", "bf", "pd")}) == 3


def test_status_reports_the_references_efficiency_and_truncation(daemon, shards, tmp_path):
    glob = f"{shards}/books/shard_*.idx"
    d = daemon(packed_conf("bf", glob, "bestfit", "pack_buffer = 1500\n") + packed_conf("pd", glob, "pad")
               + feed_conf("cc", glob, seq_len=L, batch_size=B, seed=SEED, eos=EOS))
    for feed in ("bf", "pd", "cc"):
        d.dump(feed, tmp_path / feed, rank=0, world=1, batches=25)
    status = {f["name"]: f for f in d.status()["feeds"]}
    for feed, packing in (("bf", "bestfit"), ("pd", "pad")):
        pk = status[feed]["packing"]
        published = status[feed]["batches"]
        exp = ref(packing, docs(glob, 0, 1), published, buffer_tokens=1500)
        assert pk["mode"] == packing
        assert pk["positions"] == published * B * L
        assert pk["tokens"] == sum(b["tokens"] for b in exp)
        assert pk["truncated"] == sum(b["truncated"] for b in exp)
        assert pk["documents"] == sum(b["n_docs"] for b in exp)
        assert pk["cut_documents"] == sum(b["cut_docs"] for b in exp)
        assert pk["efficiency"] == pytest.approx(pk["tokens"] / pk["positions"])
    assert status["pd"]["packing"]["truncated"] > 0
    assert status["bf"]["packing"]["truncated"] == 0
    assert status["bf"]["packing"]["efficiency"] > status["pd"]["packing"]["efficiency"]
    cc = status["cc"]["packing"]
    assert cc["mode"] == "concat" and cc["efficiency"] == 1.0 and cc["truncated"] == 0 and cc["pad_id"] is None
    table = d.ctl("status").stdout
    assert re.search(r"packing pad: efficiency \d+\.\d %; \d+/\d+ documents cut across rows, \d+ tokens truncated", table), table


def test_mixture_proportions_in_status_converge_to_the_weights(daemon, shards, tmp_path):
    d = daemon(mixture_conf("mix", shards, "pad"))
    d.dump("mix", tmp_path / "out", rank=0, world=1, batches=400)
    f = next(f for f in d.status()["feeds"] if f["name"] == "mix")
    sources = f["packing"]["sources"]
    total = sum(s["documents"] for s in sources)
    assert total == f["batches"] * B  # pad: one document per row
    units = [feed_ref.mix_parse_weight(w) for w in WEIGHTS.values()]
    want = [sum(feed_ref.mix_source(SEED, units, k) == i for k in range(total)) for i in range(len(units))]
    assert [s["documents"] for s in sources] == want
    for s in sources:
        assert s["weight"] == pytest.approx(float(WEIGHTS[s["name"]]))
        assert abs(s["share"] - s["weight"]) < 0.01, sources
    assert "source web:" in d.ctl("status").stdout


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    import test_text
    if not test_text.RANKS.exists() or not (test_text.TOKDATA / "node_modules" / "tiktoken").exists():
        pytest.skip("tokenizer data (scripts/fetch-tok-data.sh) missing")
    d = tmp_path_factory.mktemp("textpack")
    import json
    texts = test_text.paragraphs()[:900]
    (d / "a.jsonl").write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts))
    ids = test_text.tiktoken_ids(texts, d)
    return {"dir": d, "shard": test_text.TextShard(ids), "ranks": test_text.RANKS}


@pytest.mark.parametrize("packing", ["bestfit", "pad", "concat"])
def test_text_and_stored_sources_mix_and_pack_like_the_contract(daemon, shards, text_corpus, tmp_path, packing):
    """A mixture of a text source tokenized on the way and a Megatron one; and the text source alone."""
    eot = 100257
    buffer = "pack_buffer = 600\n" if packing == "bestfit" else ""
    text = (f"[feed.tx]\nformat = jsonl\nshards = {text_corpus['dir']}/a.jsonl\ntokenizer = {text_corpus['ranks']}\n"
            f"tokenizer_preset = cl100k_base\nseq_len = {L}\nbatch_size = {B}\nseed = {SEED}\nshuffle_window = 2\n"
            f"eos = {eot}\npacking = {packing}\n{buffer}")
    mix = (f"[feed.mx]\nsources = prose:0.6, web:0.4\nseq_len = {L}\nbatch_size = {B}\nseed = {SEED}\n"
           f"shuffle_window = 2\neos = {eot}\npacking = {packing}\n"
           + buffer
           + f"[feed.mx.prose]\nformat = jsonl\nshards = {text_corpus['dir']}/a.jsonl\n"
           f"tokenizer = {text_corpus['ranks']}\ntokenizer_preset = cl100k_base\n"
           f"[feed.mx.web]\nshards = {shards}/web/shard_*.idx\n")
    d = daemon(f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n" + text + mix)
    n = 50

    def text_docs(rank, world):
        rs = feed_ref.RankStream([text_corpus["shard"]], SEED, True, 2, world, rank, eos=eot)
        return feed_ref.rank_documents(rs)

    got = d.dump("tx", tmp_path / "tx", rank=1, world=2, batches=n)
    assert_batches_equal(got, ref(packing, text_docs(1, 2), n, pad_id=eot, buffer_tokens=600))
    cut = next(i for i, c in enumerate(got["cursors"]) if packing != "bestfit" or int(c.split("-")[8], 16) > 0)
    resumes_exactly(d, "tx", tmp_path, 1, 2, got, cut)

    got = d.dump("mx", tmp_path / "mx", rank=0, world=2, batches=n)
    units = [feed_ref.mix_parse_weight("0.6"), feed_ref.mix_parse_weight("0.4")]
    md = feed_ref.mixed_documents([text_docs(0, 2), docs(f"{shards}/web/shard_*.idx", 0, 2, eos=eot)], SEED, units)
    assert_batches_equal(got, ref(packing, md, n, pad_id=eot, buffer_tokens=600))
    resumes_exactly(d, "mx", tmp_path, 0, 2, got, n // 2)


# ---- small feeds: every cursor, fingerprints, counters, edge inputs and configuration errors ----

# The small feeds of these cases: their own row size, batch and seed (EOS is the same).
SMALL_L, SMALL_B, SMALL_SEED = 32, 2, 5
MASK = 0xFFFFFFFFFFFFFFFF


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Small sources so that a few dozen batches cross many epochs: short documents with empties, long ones
    (several times L), and a source with an empty shard beside a normal one."""
    d = tmp_path_factory.mktemp("review")
    for name, shards_n, docs, mean, seed in (("tiny", 1, 14, 12, 11), ("long", 1, 7, 90, 12), ("mid", 2, 9, 30, 13)):
        gen_megatron.main([str(d / name), "--shards", str(shards_n), "--docs-per-shard", str(docs), "--mean-len",
                           str(mean), "--empty-frac", "0.2", "--multi-seq-frac", "0.3", "--seed", str(seed)])
    gen_megatron.main([str(d / "mid"), "--shards", "1", "--docs-per-shard", "0", "--prefix", "zempty_", "--seed", "1"])
    return d


def glob_of(small, name):
    return f"{small}/{name}/*.idx"


def conf_one(name, small, src, packing, extra="", shuffle="true", eos=EOS):
    return (f"[feed.{name}]\nshards = {glob_of(small, src)}\nseq_len = {SMALL_L}\nbatch_size = {SMALL_B}\nseed = {SMALL_SEED}\n"
            f"shuffle = {shuffle}\nshuffle_window = 1\neos = {eos}\npacking = {packing}\n{extra}")


def conf_mix(name, small, packing, weights, extra=""):
    srcs = ", ".join(f"{s}:{w}" for s, w in weights.items())
    text = (f"[feed.{name}]\nsources = {srcs}\nseq_len = {SMALL_L}\nbatch_size = {SMALL_B}\nseed = {SMALL_SEED}\nshuffle = true\n"
            f"shuffle_window = 1\neos = {EOS}\npacking = {packing}\n{extra}")
    for s in weights:
        text += f"[feed.{name}.{s}]\nshards = {glob_of(small, s)}\n"
    return text


def rank_docs(small, src, rank, world, shuffle=True):
    shards = feed_ref.load_shards(feed_ref.expand_globs([glob_of(small, src)]))
    rs = feed_ref.RankStream(shards, SMALL_SEED, shuffle, 1, world, rank, eos=EOS)
    return feed_ref.rank_documents(rs)


def mixed_docs(small, weights, rank, world):
    units = [feed_ref.mix_parse_weight(w) for w in weights.values()]
    return feed_ref.mixed_documents([rank_docs(small, s, rank, world) for s in weights], SMALL_SEED, units)


def take(it, n):
    out = []
    for x in it:
        if len(out) == n:
            break
        out.append(x)
    return out


def concat_ref(documents, n):
    """Section 14.3's "concat" over whole documents (section 5), with section 13.2's counters."""
    flat_ids, flat_starts, cut_at = [], [], []
    need = n * SMALL_B * SMALL_L + 1
    for doc in documents:
        p = len(flat_ids)
        cut_at.append((p, p % SMALL_L + len(doc) > SMALL_L))
        flat_ids.extend(doc.tokens.tolist())
        flat_starts.extend([True] + [False] * (len(doc) - 1))
        if len(flat_ids) >= need:
            break
    ids = np.array(flat_ids[:need], np.int32)
    starts = np.array(flat_starts[:need], bool)
    out = []
    for b in range(n):
        batch = feed_ref.make_batch(ids[b * SMALL_B * SMALL_L:(b + 1) * SMALL_B * SMALL_L + 1], starts[b * SMALL_B * SMALL_L:(b + 1) * SMALL_B * SMALL_L + 1], SMALL_B, SMALL_L)
        inside = [cut for p, cut in cut_at if b * SMALL_B * SMALL_L <= p < (b + 1) * SMALL_B * SMALL_L]
        batch.update(n_docs=len(inside), cut_docs=sum(inside), tokens=SMALL_B * SMALL_L, truncated=0)
        out.append(batch)
    return out


def small_ref(packing, documents, n, pad_id=EOS, buffer_tokens=None):
    if packing == "concat":
        return concat_ref(documents, n)
    if packing == "pad":
        return take(feed_ref.pad_batches(documents, SMALL_L, SMALL_B, pad_id), n)
    return take(feed_ref.bestfit_batches(documents, SMALL_L, SMALL_B, buffer_tokens, pad_id), n)


def assert_every_cursor_resumes(d, feed, tmp_path, rank, world, n):
    """The stream from each batch's cursor equals the uninterrupted stream from the next batch on."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    whole = d.dump(feed, tmp_path / f"whole-{feed}-{rank}", rank=rank, world=world, batches=n)
    assert len(whole["cursors"]) == n and len(set(whole["cursors"])) == n
    for cut in range(n - 1):
        rest = d.dump(feed, tmp_path / f"rest-{feed}-{rank}-{cut}", rank=rank, world=world, batches=n - cut - 1,
                      cursor=whole["cursors"][cut])
        for k in ("input_ids", "labels", "position_ids"):
            if not np.array_equal(rest[k], whole[k][cut + 1:]):
                bad = np.argwhere(rest[k] != whole[k][cut + 1:])[0]
                raise AssertionError(f"{feed} rank {rank}/{world}: resuming from batch {cut}'s cursor "
                                     f"{whole['cursors'][cut]}: {k} differs first at batch {cut + 1 + bad[0]}")
        for i, cu in enumerate(rest["cu_seqlens"]):
            assert np.array_equal(cu, whole["cu_seqlens"][cut + 1 + i]), (feed, rank, cut, i)
        assert rest["cursors"] == whole["cursors"][cut + 1:], (feed, rank, cut)
    return whole


# ---- exhaustive resume ------------------------------------------------------------------------------------

ONE = [
    # (feed, source, packing, extra): bestfit with buffers smaller than a document (each document a buffer),
    # about one row, and several rows; pad; concat over long documents cut into chunks.
    ("bf1", "long", "bestfit", "pack_buffer = 1\npad_id = 7\n"),
    ("bf40", "mid", "bestfit", "pack_buffer = 40\n"),
    ("bf150", "tiny", "bestfit", "pack_buffer = 150\npad_id = 0\n"),
    ("bflong", "long", "bestfit", "pack_buffer = 200\n"),
    ("pd", "long", "pad", ""),
    ("pdtiny", "tiny", "pad", "pad_id = 1\n"),
]


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1), (3, 0)])
def test_every_cursor_of_a_single_stream_resumes_exactly(daemon, small, tmp_path, world, rank):
    d = daemon("".join(conf_one(f, small, s, p, e) for f, s, p, e in ONE))
    n = 24
    for feed, src, packing, extra in ONE:
        whole = assert_every_cursor_resumes(d, feed, tmp_path, rank, world, n)
        m = re.search(r"pack_buffer = (\d+)", extra)
        pad = re.search(r"pad_id = (\d+)", extra)
        exp = small_ref(packing, rank_docs(small, src, rank, world), n, pad_id=int(pad.group(1)) if pad else EOS,
                  buffer_tokens=int(m.group(1)) if m else None)
        assert_batches_equal(whole, exp)
        # The feed runs through several epochs in these batches (the cursors' epoch field).
        assert int(whole["cursors"][-1].split("-")[5], 16) >= 2, (feed, whole["cursors"][-1])


MIX_W = {"tiny": "0.5", "long": "0.2", "mid": "0.3"}


@pytest.mark.parametrize("packing,extra", [("bestfit", "pack_buffer = 70\n"), ("bestfit", "pack_buffer = 1\n"),
                                           ("pad", ""), ("concat", "")])
def test_every_cursor_of_a_mixture_resumes_exactly(daemon, small, tmp_path, packing, extra):
    d = daemon(conf_mix("mx", small, packing, MIX_W, extra))
    n = 24
    for world, rank in ((1, 0), (2, 0), (3, 2)):
        whole = assert_every_cursor_resumes(d, "mx", tmp_path / f"w{world}", rank, world, n)
        m = re.search(r"pack_buffer = (\d+)", extra)
        exp = small_ref(packing, mixed_docs(small, MIX_W, rank, world), n, buffer_tokens=int(m.group(1)) if m else None)
        assert_batches_equal(whole, exp)


def test_a_one_source_mixture_serves_its_plain_feeds_batches(daemon, small, tmp_path):
    """A mixture of one source is that source's stream: the same batches as the plain feed in every packing."""
    conf = ""
    for packing, extra in (("concat", ""), ("bestfit", "pack_buffer = 50\n"), ("pad", "")):
        conf += conf_one(f"p{packing}", small, "mid", packing, extra)
        conf += conf_mix(f"m{packing}", small, packing, {"mid": "1"}, extra)
    d = daemon(conf)
    for packing in ("concat", "bestfit", "pad"):
        plain = d.dump(f"p{packing}", tmp_path / f"p{packing}", rank=1, world=2, batches=30)
        mixed = d.dump(f"m{packing}", tmp_path / f"m{packing}", rank=1, world=2, batches=30)
        for k in ("input_ids", "labels", "position_ids"):
            assert np.array_equal(plain[k], mixed[k]), (packing, k)
        assert all(c.startswith("fc2-") for c in mixed["cursors"])


def with_check(body):
    """A cursor text with its check field (section 7.1)."""
    return f"{body}-{feed_ref.mix(fnv(0xCBF29CE484222325, body.encode())) & 0xFFFFFFFF:08x}"


def test_cursors_naming_no_position_are_refused_and_the_daemon_serves_on(daemon, small, tmp_path):
    d = daemon(conf_one("bf", small, "long", "bestfit", "pack_buffer = 100\n") + conf_one("pd", small, "long", "pad")
               + conf_mix("mc", small, "concat", MIX_W) + conf_mix("mb", small, "bestfit", MIX_W, "pack_buffer = 60\n"))
    bf = d.dump("bf", tmp_path / "bf", batches=6)
    pd = d.dump("pd", tmp_path / "pd", batches=3)
    mc = d.dump("mc", tmp_path / "mc", batches=6)
    mb = d.dump("mb", tmp_path / "mb", batches=6)
    bad = []
    f = bf["cursors"][2].split("-")
    bad.append(("bf", with_check("-".join(f[:8] + ["3e7"]))))   # a row far past the buffer's rows
    f = pd["cursors"][1].split("-")
    bad.append(("pd", with_check("-".join(f[:8] + ["1"]))))     # pad has row 0 only
    f = mc["cursors"][2].split("-")
    bad.append(("mc", with_check("-".join(f[:6] + ["fffff"] + f[7:-1]))))  # offset past document k's end
    f = mb["cursors"][2].split("-")
    bad.append(("mb", with_check("-".join(f[:6] + ["1"] + f[7:-1]))))      # an offset outside concat
    bad.append(("mb", with_check("-".join(f[:7] + ["3e7"] + f[8:-1]))))    # a row past the buffer
    bad.append(("mb", with_check("-".join(f[:8] + ["2"] + f[9:15]))))      # two sources named, three in the feed
    bad.append(("bf", mb["cursors"][1]))                                    # fc2 on a feed of one stream
    for feed, cursor in bad:
        p = d.dump(feed, tmp_path / "x", batches=2, cursor=cursor, check=False)
        assert p.returncode != 0, (feed, cursor)
        assert re.search(rf"cursor (does not name a position in rank 0's stream of feed {feed}|names row"
                         rf"|belongs to another feed|is malformed|malformed)", p.stderr), (feed, cursor, p.stderr)
    # Each of them was refused alone: resuming from the real cursors still works.
    rest = d.dump("mb", tmp_path / "rest", batches=3, cursor=mb["cursors"][2])
    assert np.array_equal(rest["input_ids"], mb["input_ids"][3:6])


# ---- fingerprints from the spec ---------------------------------------------------------------------------

def fnv(h, data):
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def u64(x):
    return struct.pack("<Q", x & MASK)


def stream_fingerprint(small, src, seed=SMALL_SEED, shuffle=True, window=1, bos=None, eos=EOS):
    """Section 8, from the text: feedd-megatron-v1, S, per shard path/idx/bin ids, then the order parameters."""
    paths = feed_ref.expand_globs([glob_of(small, src)])
    h = fnv(0xCBF29CE484222325, b"feedd-megatron-v1")
    h = fnv(h, u64(len(paths)))
    for p in paths:
        idx = os.path.realpath(p)
        h = fnv(h, idx.encode() + b"\0")
        for f in (idx, idx[:-4] + ".bin"):
            st = os.stat(f)
            h = fnv(h, u64(st.st_size) + u64(st.st_mtime_ns // 10**9) + u64(st.st_mtime_ns % 10**9))
    for v in (seed, int(shuffle), window, SMALL_L, SMALL_B, MASK if bos is None else bos, MASK if eos is None else eos):
        h = fnv(h, u64(v))
    return feed_ref.mix(h)


def packing_bytes(packing, buffer_tokens, pad_id):
    return (packing.encode() + b"\0" + u64(buffer_tokens if packing == "bestfit" else 0)
            + u64(MASK if packing == "concat" else pad_id))


def test_fingerprints_follow_sections_8_and_15(daemon, small, tmp_path):
    d = daemon(conf_one("cc", small, "mid", "concat") + conf_one("bf", small, "mid", "bestfit", "pack_buffer = 99\n")
               + conf_one("bfd", small, "mid", "bestfit") + conf_one("pd", small, "mid", "pad", "pad_id = 3\n")
               + conf_mix("mx", small, "pad", MIX_W) + conf_mix("mc", small, "concat", MIX_W))
    fp = {f["name"]: int(f["fingerprint"], 16) for f in d.status()["feeds"]}
    stream = stream_fingerprint(small, "mid")
    # concat of one stream: section 8 unchanged, so cursors saved before packing existed still resume.
    assert fp["cc"] == stream
    for feed, packing, buf, pad in (("bf", "bestfit", 99, EOS), ("bfd", "bestfit", 64 * SMALL_L, EOS), ("pd", "pad", 0, 3)):
        h = fnv(fnv(0xCBF29CE484222325, b"feedd-packing-v1"), u64(stream) + packing_bytes(packing, buf, pad))
        assert fp[feed] == feed_ref.mix(h), feed
    for feed, packing in (("mx", "pad"), ("mc", "concat")):
        h = fnv(0xCBF29CE484222325, b"feedd-mixture-v1")
        h = fnv(h, packing_bytes(packing, 0, EOS) + u64(len(MIX_W)))
        for s, w in MIX_W.items():
            h = fnv(h, s.encode() + b"\0" + u64(feed_ref.mix_parse_weight(w)) + u64(stream_fingerprint(small, s)))
        assert fp[feed] == feed_ref.mix(h), feed
    # And the cursors carry it.
    got = d.dump("bf", tmp_path / "bf", batches=2)
    assert all(c.split("-")[1] == f"{fp['bf']:016x}" for c in got["cursors"])


# ---- counters over many epochs ----------------------------------------------------------------------------

@pytest.mark.parametrize("feed,packing,extra", [("bf", "bestfit", "pack_buffer = 50\n"), ("pd", "pad", ""),
                                                ("cc", "concat", ""),
                                                ("mxb", "bestfit", "pack_buffer = 90\n"), ("mxp", "pad", ""),
                                                ("mxc", "concat", "")])
def test_status_counters_equal_the_reference_over_many_epochs(daemon, small, tmp_path, feed, packing, extra):
    mixture = feed.startswith("mx")
    d = daemon(conf_mix(feed, small, packing, MIX_W, extra) if mixture
               else conf_one(feed, small, "long", packing, extra))
    got = d.dump(feed, tmp_path / "out", batches=60)
    last = got["cursors"][-1].split("-")
    assert max(int(x, 16) for x in (last[9:9 + 3 * int(last[8], 16):3] if mixture else last[5:6])) >= 3, "many epochs"
    st = next(f for f in d.status()["feeds"] if f["name"] == feed)
    published = st["batches"]
    docs = mixed_docs(small, MIX_W, 0, 1) if mixture else rank_docs(small, "long", 0, 1)
    m = re.search(r"pack_buffer = (\d+)", extra)
    exp = small_ref(packing, docs, published, buffer_tokens=int(m.group(1)) if m else None)
    assert_batches_equal(got, exp[:60])
    pk = st["packing"]
    assert pk["positions"] == published * SMALL_B * SMALL_L
    assert pk["tokens"] == sum(b["tokens"] for b in exp)
    assert pk["truncated"] == sum(b["truncated"] for b in exp)
    assert pk["documents"] == sum(b["n_docs"] for b in exp)
    assert pk["cut_documents"] == sum(b["cut_docs"] for b in exp)
    if mixture:
        # Documents per source whose first position is in the published batches.
        want = [0] * len(MIX_W)
        for doc in first_pieces(packing, mixed_docs(small, MIX_W, 0, 1), published,
                                int(m.group(1)) if m else None):
            want[doc.source] += 1
        assert [s["documents"] for s in pk["sources"]] == want


def first_pieces(packing, documents, n, buffer_tokens):
    """The documents whose first position lies in the first n batches, in the order packed."""
    documents = iter(documents)
    if packing == "pad":
        return [next(documents) for _ in range(n * SMALL_B)]
    if packing == "concat":
        out, pos = [], 0
        while pos < n * SMALL_B * SMALL_L:
            out.append(next(documents))
            pos += len(out[-1])
        return out
    rows = []
    while len(rows) < n * SMALL_B:
        buf, total = [], 0
        while total < buffer_tokens:
            buf.append(next(documents))
            total += len(buf[-1])
        rows += [[buf[d] for d, off, _ in row if off == 0] for row in feed_ref.bestfit_pack([len(x) for x in buf], SMALL_L)]
    return [doc for row in rows[:n * SMALL_B] for doc in row]


# ---- edge inputs ------------------------------------------------------------------------------------------

def test_pad_id_equal_to_real_tokens_is_masked_by_position_not_value(daemon, small, tmp_path):
    """pad_id = eos and pad_id = a token that occurs inside documents: labels -100 exactly where the contract puts
    them; every real token keeps its label even when it equals pad_id."""
    common = int(next(x for x in rank_docs(small, "mid", 0, 1) if len(x) > 2).tokens[0])
    d = daemon(conf_one("a", small, "mid", "bestfit", f"pack_buffer = 60\npad_id = {common}\n")
               + conf_one("b", small, "mid", "pad", f"pad_id = {common}\n")
               + conf_one("c", small, "mid", "bestfit", f"pack_buffer = 60\npad_id = {EOS}\n"))
    for feed, packing, pad in (("a", "bestfit", common), ("b", "pad", common), ("c", "bestfit", EOS)):
        got = d.dump(feed, tmp_path / feed, batches=20)
        assert_batches_equal(got, small_ref(packing, rank_docs(small, "mid", 0, 1), 20, pad_id=pad,
                                      buffer_tokens=60))
        assert ((got["input_ids"] == pad) & (got["labels"] == -100)).any(), "padding"
        if pad == common:
            real = (got["input_ids"] == pad) & (got["labels"] != -100)
            assert real.any(), "some real tokens equal pad_id and keep their labels"


def test_a_source_with_too_few_documents_for_the_world_is_refused_by_name(daemon, small, tmp_path):
    d = daemon(conf_mix("mx", small, "bestfit", {"tiny": "1", "long": "1"}))
    n_long = sum(int(x) > 0 for x in feed_ref.load_shards(feed_ref.expand_globs([glob_of(small, "long")]))[0].doc_lens)
    p = d.dump("mx", tmp_path / "x", rank=0, world=n_long + 1, batches=1, check=False)
    assert p.returncode != 0
    want = f"feed mx.long has {n_long} non-empty documents, fewer than the world size {n_long + 1}"
    assert want in p.stderr, p.stderr
    # The world that fits still works, and the daemon serves on.
    d.dump("mx", tmp_path / "ok", rank=n_long - 1, world=n_long, batches=3)


def test_a_source_of_only_an_empty_shard_fails_its_feed_clearly(daemon, small, tmp_path):
    conf = conf_mix("mx", small, "pad", {"tiny": "1", "mid": "1"}).replace(
        f"shards = {glob_of(small, 'mid')}", f"shards = {small}/mid/zempty_*.idx")
    d = daemon(conf_one("ok", small, "tiny", "pad") + conf)
    st = {f["name"]: f for f in d.status()["feeds"]}
    p = d.dump("mx", tmp_path / "x", batches=1, check=False)
    assert p.returncode != 0 and "mid" in p.stderr, p.stderr
    assert st["ok"]["state"] == "ready"
    d.dump("ok", tmp_path / "ok", batches=2)


def test_weight_limits_and_too_many_sources_are_clear_errors(tmp_path, small):
    def check(sources, want, n_sections=None):
        names = [e.split(":")[0].strip() for e in sources.split(",")][:20]
        text = (f"[feed.m]\nsources = {sources}\nseq_len = {SMALL_L}\nbatch_size = {SMALL_B}\n"
                + "".join(f"[feed.m.{s}]\nshards = {glob_of(small, 'tiny')}\n" for s in names[:n_sections]))
        conf = tmp_path / "w.conf"
        conf.write_text(text)
        p = subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
        return p, conf

    for sources, why in (("a:1e-9, b:1", "weight '1e-9'"), ("a:0, b:1", "weight '0'"),
                         ("a:1000000.000000001, b:1", "weight '1000000.000000001'"),
                         ("a:0.0000000001, b:1", "weight '0.0000000001'"), ("a:-1, b:1", "weight '-1'"),
                         (", ".join(f"s{i}:1" for i in range(20)), "more than 8 sources"),
                         (", ".join(f"s{i}:1" for i in range(9)), "more than 8 sources"),
                         ("a:1, a:2", "named twice")):
        p, conf = check(sources, why)
        assert p.returncode != 0, sources[:80]
        assert f"{conf}:2: sources:" in p.stderr and why in p.stderr, p.stderr
    # The extremes that are allowed: 1e-9 against 1000000, and 8 sources.
    p, _ = check("a:0.000000001, b:1000000", None)
    assert p.returncode == 0, p.stderr
    p, _ = check(", ".join(f"s{i}:1" for i in range(8)), None)
    assert p.returncode == 0, p.stderr


def test_a_tiny_weight_next_to_a_huge_one_serves_the_contract(daemon, small, tmp_path):
    w = {"tiny": "0.000000001", "mid": "1000000"}
    d = daemon(conf_mix("mx", small, "bestfit", w, "pack_buffer = 64\n"))
    got = d.dump("mx", tmp_path / "out", rank=1, world=2, batches=20)
    assert_batches_equal(got, small_ref("bestfit", mixed_docs(small, w, 1, 2), 20, buffer_tokens=64))
    assert_every_cursor_resumes(d, "mx", tmp_path, 1, 2, 8)


# ---- configuration errors name their line -----------------------------------------------------------------

CONF_CASES = [
    # (the feed's extra lines, the mixture's source section extra lines, the line at fault, words)
    ("packing = tight\n", "", 7, "packing: 'tight' is not one of concat, bestfit, pad"),
    ("packing = bestfit\npack_buffer = 0\n", "", 8, "pack_buffer: '0' is not an integer in 1..4294967296"),
    ("packing = bestfit\npack_buffer = 4294967297\n", "", 8, "pack_buffer: '4294967297'"),
    ("pack_buffer = 100\n", "", 7, "pack_buffer: applies to packing = bestfit only"),
    ("packing = pad\npack_buffer = 100\n", "", 8, "pack_buffer: applies to packing = bestfit only"),
    ("pad_id = 5\n", "", 7, "pad_id: applies to packing = bestfit or pad"),
    ("packing = pad\npad_id = -1\n", "", 8, "pad_id: '-1' is not a token id"),
    ("packing = pad\npad_id = 2147483648\n", "", 8, "pad_id: '2147483648' is not a token id"),
    ("sources = a:1, b\n", "", 7, "sources: entry 2 ('b') is not name:weight"),
    ("sources = a:1, b c:1\n", "", 7, "sources: entry 2 ('b c:1'): ' ' is not allowed in a source name"),
    ("sources = a:1, ghost:1\n", "", 7, "sources: source 'ghost' has no section [feed.f.ghost]"),
    ("sources = a:1\nformat = megatron\n", "", 8, "'format' belongs in the sections of [feed.f]'s sources"),
    ("sources = a:1\n", "seed = 3\n", 9, "'seed' is set for all of [feed.f]'s sources in [feed.f]"),
    ("sources = a:1\n", "packing = pad\n", 9, "'packing' is set for all of [feed.f]'s sources in [feed.f]"),
    ("sources = a:1\n", "sources = x:1\n", 9, "'sources' is set for all of [feed.f]'s sources in [feed.f]"),
]


@pytest.mark.parametrize("feed_extra,src_extra,line,words", CONF_CASES)
def test_configuration_errors_of_the_new_keys_name_their_line(tmp_path, small, feed_extra, src_extra, line, words):
    mixture = "sources" in feed_extra
    text = "# a comment first\n[feed.f]\n"  # the feed's keys start on line 3
    text += f"seq_len = {SMALL_L}\nbatch_size = {SMALL_B}\neos = {EOS}\n"
    if not mixture:
        text += f"shards = {glob_of(small, 'tiny')}\n"
    else:
        text += "shuffle = true\n"
    text += feed_extra
    if mixture:
        text += f"[feed.f.a]\n{src_extra}shards = {glob_of(small, 'tiny')}\n"
    conf = tmp_path / "f.conf"
    conf.write_text(text)
    p = subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0, text
    assert f"{conf}:{line}:" in p.stderr and words in p.stderr, (text, p.stderr)


def test_eight_sources_with_long_names_can_be_configured(tmp_path, small):
    # The longest a section header allows: [feed.m.NAME] holds at most 49 characters (libinih).
    names = [f"source_{i}_" + "x" * 33 for i in range(8)]
    assert all(len("feed.m." + n) == 49 for n in names)
    text = ("[feed.m]\nsources = " + ",\n  ".join(f"{n}:1" for n in names) + f"\nseq_len = {SMALL_L}\nbatch_size = {SMALL_B}\n"
            + "".join(f"[feed.m.{n}]\nshards = {glob_of(small, 'tiny')}\n" for n in names))
    conf = tmp_path / "long.conf"
    conf.write_text(text)
    p = subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_a_section_name_libinih_would_cut_is_refused_with_its_line(tmp_path, small):
    # libinih silently keeps only the first 49 characters of a section name; a cut
    # [feed.NAME] would define a different feed than the one written.
    name = "f" * 45
    conf = tmp_path / "cut.conf"
    conf.write_text(f"[feedd]\nthreads = 1\n[feed.{name}]\nshards = {glob_of(small, 'tiny')}\n")
    p = subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"{conf}:3:" in p.stderr and "50 characters long" in p.stderr, p.stderr
    ok = tmp_path / "ok.conf"
    ok.write_text(f"[feed.{name[:44]}]\nshards = {glob_of(small, 'tiny')}\n")
    p = subprocess.run([str(FEEDD), "--check", "-c", str(ok)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert name[:44] in p.stdout + p.stderr, p.stdout + p.stderr


def test_a_mixtures_eos_given_by_name_is_refused_with_its_line(tmp_path, small):
    conf = tmp_path / "n.conf"
    conf.write_text(f"[feed.m]\nsources = a:1\nseq_len = {SMALL_L}\nbatch_size = {SMALL_B}\neos = <|endoftext|>\n"
                    f"[feed.m.a]\nshards = {glob_of(small, 'tiny')}\n")
    p = subprocess.run([str(FEEDD), "--check", "-c", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"{conf}:5:" in p.stderr and "token id" in p.stderr and "tokenizer" not in p.stderr, p.stderr


# ---- text sources: all bad records, and memory over many epochs --------------------------------------------

@pytest.fixture(scope="module")
def tok():
    import test_text
    if not test_text.RANKS.exists():
        pytest.skip("tokenizer data (scripts/fetch-tok-data.sh) missing")
    return test_text


@pytest.mark.parametrize("shuffle,fraction", [("false", "1"), ("true", "1"), ("true", "0.001")])
def test_a_text_source_of_only_bad_records_fails_the_mixture_clearly(daemon, small, tmp_path, tok, shuffle, fraction):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(b'{"body": "no text %d"}\n' % i for i in range(40)))
    conf = (f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n[feed.mx]\nsources = web:0.5, junk:0.5\nseq_len = {SMALL_L}\n"
            f"batch_size = {SMALL_B}\nseed = {SMALL_SEED}\nshuffle = {shuffle}\neos = {EOS}\npacking = bestfit\n"
            f"[feed.mx.web]\nshards = {glob_of(small, 'mid')}\n"
            f"[feed.mx.junk]\nformat = jsonl\nshards = {bad}\ntokenizer = {tok.RANKS}\ntokenizer_preset = cl100k_base\n"
            f"max_bad_fraction = {fraction}\n" + conf_one("other", small, "tiny", "pad"))
    d = daemon(conf)
    t0 = time.monotonic()
    p = d.dump("mx", tmp_path / "x", batches=5, check=False)
    took = time.monotonic() - t0
    assert p.returncode != 0
    every = "feed mx.junk: every one of its 40 documents is a bad record"
    # Under 0.001 the fraction may trip first, depending on how many records one chunk tokenizes.
    assert (every in p.stderr or (fraction != "1" and "max_bad_fraction" in p.stderr)) and "bad.jsonl" in p.stderr, \
        p.stderr
    # Not a busy loop through a thousand epochs of re-tokenizing nothing: (generous, only catches the loop).
    assert took < 30, took
    # The daemon serves everything else.
    d.dump("other", tmp_path / "other", batches=3)


@pytest.mark.parametrize("packing,extra", [("bestfit", "pack_buffer = 100\n"), ("pad", ""), ("concat", "")])
def test_every_cursor_of_a_text_mixture_resumes_exactly(daemon, small, tmp_path, tok, packing, extra):
    """A source tokenized on the way beside a stored one: each batch's cursor, several epochs of the text."""
    texts = [t[:150] for t in tok.paragraphs()[:12]]
    (tmp_path / "a.jsonl").write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts))
    conf = (f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n[feed.tx]\nsources = prose:0.6, web:0.4\nseq_len = {SMALL_L}\n"
            f"batch_size = {SMALL_B}\nseed = {SMALL_SEED}\nshuffle = true\nshuffle_window = 1\neos = {tok.EOT}\n"
            f"packing = {packing}\n{extra}[feed.tx.prose]\nformat = jsonl\nshards = {tmp_path}/a.jsonl\n"
            f"tokenizer = {tok.RANKS}\ntokenizer_preset = cl100k_base\n"
            f"[feed.tx.web]\nshards = {glob_of(small, 'mid')}\n")
    d = daemon(conf)
    n = 40
    whole = assert_every_cursor_resumes(d, "tx", tmp_path, 1, 2, n)
    text_shard = tok.TextShard(tok.tiktoken_ids(texts, tmp_path))
    prose = feed_ref.rank_documents(feed_ref.RankStream([text_shard], SMALL_SEED, True, 1, 2, 1, eos=tok.EOT))
    web_shards = feed_ref.load_shards(feed_ref.expand_globs([glob_of(small, "mid")]))
    web = feed_ref.rank_documents(feed_ref.RankStream(web_shards, SMALL_SEED, True, 1, 2, 1, eos=tok.EOT))
    units = [feed_ref.mix_parse_weight("0.6"), feed_ref.mix_parse_weight("0.4")]
    m = re.search(r"pack_buffer = (\d+)", extra)
    exp = small_ref(packing, feed_ref.mixed_documents([prose, web], SMALL_SEED, units), n, pad_id=tok.EOT,
              buffer_tokens=int(m.group(1)) if m else None)
    assert_batches_equal(whole, exp)
    assert int(whole["cursors"][-1].split("-")[9], 16) >= 2, "the text source went through several epochs"


def test_a_mixtures_source_without_tokens_is_named(daemon, small, tmp_path, tok):
    # Valid records with empty texts: nothing is bad, and yet the source has no token to give.
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": ""}\n' * 40)
    d = daemon(f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n[feed.mx]\nsources = web:0.5, junk:0.5\nseq_len = {SMALL_L}\n"
               f"batch_size = {SMALL_B}\nseed = {SMALL_SEED}\nshuffle = false\n"
               f"[feed.mx.web]\nshards = {glob_of(small, 'mid')}\n"
               f"[feed.mx.junk]\nformat = jsonl\nshards = {bad}\ntokenizer = {tok.RANKS}\n"
               f"tokenizer_preset = cl100k_base\nmax_bad_fraction = 1\n")
    p = d.dump("mx", tmp_path / "x", batches=5, check=False)
    assert p.returncode != 0 and "source mx.junk gives this rank no tokens" in p.stderr, p.stderr


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_stays_flat_over_many_epochs_of_a_text_mixture(daemon, small, tmp_path, tok):
    texts = tok.paragraphs()[:60]
    (tmp_path / "a.jsonl").write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts))
    conf = (f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n")
    for packing in ("bestfit", "pad", "concat"):
        conf += (f"[feed.{packing}]\nsources = prose:0.7, web:0.3\nseq_len = 256\nbatch_size = 8\nseed = {SMALL_SEED}\n"
                 f"shuffle = true\nshuffle_window = 1\neos = 100257\npacking = {packing}\n"
                 f"[feed.{packing}.prose]\nformat = jsonl\nshards = {tmp_path}/a.jsonl\ntokenizer = {tok.RANKS}\n"
                 f"tokenizer_preset = cl100k_base\n[feed.{packing}.web]\nshards = {glob_of(small, 'mid')}\n")
    d = daemon(conf)
    pid = d.proc.pid
    for packing in ("bestfit", "pad", "concat"):
        d.dump(packing, tmp_path / f"warm-{packing}", batches=200)
        before = rss_kib(pid)
        got = d.dump(packing, tmp_path / f"long-{packing}", batches=2000)
        after = rss_kib(pid)
        epochs = int(got["cursors"][-1].split("-")[9], 16)
        assert epochs >= 50, epochs
        # 2000 batches hold 2000 * 8 * 256 * 4 bytes = 16 MiB of tokens; keeping chunks would show as much.
        assert after - before < 4096, (packing, before, after)
