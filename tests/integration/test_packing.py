# SPDX-License-Identifier: MIT
"""Packing modes (bestfit, pad) and mixtures, end to end: a real feedd, real
shards, batches dumped by a real client and compared with tests/ref/feed_ref.py
(docs/sample-order.md, sections 11 to 15); cursors that resume inside a
packed buffer and inside a mixture's epochs; cursors of another packing
refused; efficiency, truncation and realised proportions in the status.

Runs with Debian's /usr/bin/python3.
"""

import itertools
import re

import numpy as np
import pytest

from conftest import assert_batches_equal, feed_conf, feed_ref, gen_megatron

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
            assert re.fullmatch(r"fc2(-[0-9a-f]+){8}(-[0-9a-f]+){9}-[0-9a-f]{8}", c), c


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
