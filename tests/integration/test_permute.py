# SPDX-License-Identifier: MIT
"""Shuffle windows over `shuffle_list_max` (docs/sample-order.md, section 3.1),
end to end: a real feedd with a small M so that every window is permuted by
the keyed bijection instead of Fisher-Yates, compared batch by batch with
tests/ref/feed_ref.py (concat, pad, bestfit; several ranks; across epochs),
resumed from cursors in the middle of a permuted window, for a Megatron
feed and a text feed; and the fingerprint rule of section 8: M counts only
for a feed whose windows can exceed it.

Runs with Debian's /usr/bin/python3.
"""

import json
import subprocess

import numpy as np
import pytest

from conftest import DAEMON_WRAPPER, FEEDD, assert_batches_equal, feed_conf, feed_ref, gen_megatron, write_sparse_shard

L, B, SEED, EOS = 64, 4, 11, 50256
M = 100  # every window of these feeds (2 shards of ~150 documents) holds more


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("permute")
    gen_megatron.main([str(d / "web"), "--shards", "3", "--docs-per-shard", "150", "--mean-len", "40",
                       "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", "4"])
    return d


def glob_of(shards):
    return f"{shards}/web/shard_*.idx"


def ref_docs(glob, rank, world, list_max=M, shuffle=True, window=2, eos=EOS):
    rs = feed_ref.RankStream(feed_ref.load_shards(feed_ref.expand_globs([glob])), SEED, shuffle, window, world, rank,
                             eos=eos, list_max=list_max)
    return feed_ref.rank_documents(rs)


def take(it, n):
    out = []
    for x in it:
        if len(out) == n:
            break
        out.append(x)
    return out


def concat_ref(documents, n):
    """Section 14.3's concat over a document sequence, cut per section 5."""
    ids, starts, need = [], [], n * B * L + 1
    for doc in documents:
        t = doc.tokens
        ids.append(t)
        s = np.zeros(len(t), bool)
        s[0] = True
        starts.append(s)
        need -= len(t)
        if need <= 0:
            break
    ids, starts = np.concatenate(ids), np.concatenate(starts)
    return [feed_ref.make_batch(ids[b * B * L:(b + 1) * B * L + 1], starts[b * B * L:(b + 1) * B * L + 1], B, L)
            for b in range(n)]


def ref(packing, documents, n, pad_id=EOS, buffer_tokens=None):
    if packing == "concat":
        return concat_ref(documents, n)
    if packing == "pad":
        return take(feed_ref.pad_batches(documents, L, B, pad_id), n)
    return take(feed_ref.bestfit_batches(documents, L, B, buffer_tokens, pad_id), n)


def conf(name, glob, packing, list_max=M, extra=""):
    lm = f"shuffle_list_max = {list_max}\n" if list_max else ""
    return feed_conf(name, glob, seq_len=L, batch_size=B, seed=SEED, eos=EOS,
                     extra=f"packing = {packing}\n{lm}{extra}")


def resumes_exactly(d, feed, tmp_path, rank, world, whole, cut):
    rest = d.dump(feed, tmp_path / f"rest{cut}", rank=rank, world=world, batches=len(whole["cursors"]) - cut - 1,
                  cursor=whole["cursors"][cut])
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(rest[k], whole[k][cut + 1:]), k
    assert rest["cursors"] == whole["cursors"][cut + 1:]


def test_the_reference_uses_the_bijection_only_over_list_max():
    """The reference's own check: a window over M is not Fisher-Yates' order; at or under M it is."""
    counts = [150, 140, 0, 151]
    fy = feed_ref.epoch_order(counts, SEED, True, 2, 1)
    assert feed_ref.epoch_order(counts, SEED, True, 2, 1, list_max=301) == fy  # no two shards hold more than 301
    bij = feed_ref.epoch_order(counts, SEED, True, 2, 1, list_max=M)
    assert bij != fy and sorted(bij) == sorted(fy)
    assert feed_ref.epoch_order(counts, SEED, False, 2, 1, list_max=M) == feed_ref.epoch_order(counts, SEED, False, 2, 1)


@pytest.mark.parametrize("packing,world,rank", [("concat", 1, 0), ("concat", 3, 2), ("pad", 2, 1),
                                                ("bestfit", 2, 0)])
def test_megatron_windows_over_list_max_follow_the_bijection(daemon, shards, tmp_path, packing, world, rank):
    glob = glob_of(shards)
    extra = "pack_buffer = 500\n" if packing == "bestfit" else ""
    d = daemon(conf("p", glob, packing, extra=extra))
    n = 70  # 70 * 256 positions: more than the feed's ~17,600 (two windows a epoch), so epoch 1 too
    got = d.dump("p", tmp_path / "out", rank=rank, world=world, batches=n)
    exp = ref(packing, ref_docs(glob, rank, world), n, buffer_tokens=500)
    assert_batches_equal(got, exp)


def test_megatron_resumes_inside_a_permuted_window(daemon, shards, tmp_path):
    glob = glob_of(shards)
    d = daemon(conf("p", glob, "concat") + conf("b", glob, "bestfit", extra="pack_buffer = 300\n"))
    for feed in ("p", "b"):
        whole = d.dump(feed, tmp_path / f"whole-{feed}", rank=1, world=2, batches=40)
        (tmp_path / feed).mkdir()
        for cut in (3, 17, 31):
            resumes_exactly(d, feed, tmp_path / feed, 1, 2, whole, cut)


def test_fingerprint_names_list_max_only_where_a_window_can_exceed_it(daemon, shards, tmp_path):
    """Section 8: M is part of the identity only of a feed one of whose windows can exceed it."""
    glob = glob_of(shards)
    # The two largest shards hold 300 documents: M >= 300 can never be reached.
    d = daemon(conf("dflt", glob, "concat", list_max=0) + conf("big", glob, "concat", list_max=300)
               + conf("small", glob, "concat", list_max=299) + conf("other", glob, "concat", list_max=200))
    fps = {f["name"]: f["fingerprint"] for f in d.status()["feeds"]}
    assert fps["dflt"] == fps["big"]
    assert len({fps["dflt"], fps["small"], fps["other"]}) == 3
    # The Fisher-Yates feed's stream is unchanged (the reference without M), and its cursors are refused by the
    # permuted one: never resumed on a different order.
    plain = d.dump("dflt", tmp_path / "dflt", rank=0, world=1, batches=5)
    assert_batches_equal(plain, ref("concat", ref_docs(glob, 0, 1, list_max=0), 5))
    p = d.dump("small", tmp_path / "x", rank=0, world=1, batches=1, cursor=plain["cursors"][2], check=False)
    assert p.returncode != 0
    assert "cursor belongs to another feed or another version of feed small" in p.stderr, p.stderr
    ok = d.dump("big", tmp_path / "y", rank=0, world=1, batches=2, cursor=plain["cursors"][2])
    assert np.array_equal(ok["input_ids"], plain["input_ids"][3:5])


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    import test_text
    if (not test_text.RANKS.exists() or not (test_text.TOKDATA / "node_modules" / "tiktoken").exists()
            or not (test_text.TOKDATA / "corpus-small.txt").exists()):
        pytest.skip("tokenizer data (scripts/fetch-tok-data.sh) missing")
    d = tmp_path_factory.mktemp("permtext")
    texts = test_text.paragraphs()[:600]
    (d / "a.jsonl").write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts[:350]))
    (d / "b.jsonl").write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts[350:]))
    ids = test_text.tiktoken_ids(texts, d)
    return {"dir": d, "shards": [test_text.TextShard(ids[:350]), test_text.TextShard(ids[350:])],
            "ranks": test_text.RANKS}


@pytest.mark.parametrize("packing", ["concat", "pad", "bestfit"])
def test_a_text_feed_over_list_max_follows_the_bijection_and_resumes(daemon, text_corpus, tmp_path, packing):
    eot = 100257
    buffer = "pack_buffer = 600\n" if packing == "bestfit" else ""
    text = (f"[feed.tx]\nformat = jsonl\nshards = {text_corpus['dir']}/*.jsonl\ntokenizer = {text_corpus['ranks']}\n"
            f"tokenizer_preset = cl100k_base\nseq_len = {L}\nbatch_size = {B}\nseed = {SEED}\nshuffle_window = 1\n"
            f"eos = {eot}\npacking = {packing}\nshuffle_list_max = {M}\n{buffer}")
    d = daemon(f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n" + text)
    n = 40
    for rank, world in ((1, 2), (0, 3)):
        rs = feed_ref.RankStream(text_corpus["shards"], SEED, True, 1, world, rank, eos=eot, list_max=M)
        got = d.dump("tx", tmp_path / f"tx{rank}", rank=rank, world=world, batches=n)
        assert_batches_equal(got, ref(packing, feed_ref.rank_documents(rs), n, pad_id=eot, buffer_tokens=600))
    resumes_exactly(d, "tx", tmp_path, 0, 3, got, 13)


def anon_mib(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Anonymous line")


def test_a_window_over_the_default_list_max_holds_nothing_per_document(daemon, tmp_path):
    """Issue #22: one shuffled window of 4 M documents (over the default M = 2^21). With the bijection the
    daemon's anonymous memory stays a few MiB while a client reads it; the same window as a Fisher-Yates list
    (M raised over it) holds 4 + 2 bytes per document, built on attach and ahead: the measure sees lists."""
    if DAEMON_WRAPPER or "libasan" in subprocess.run(["ldd", str(FEEDD)], capture_output=True, text=True).stdout:
        pytest.skip("anonymous memory is the allocator's under a sanitizer or valgrind")
    data = tmp_path / "sparse"
    data.mkdir()
    for i in range(2):
        write_sparse_shard(data / f"s{i}", 2_000_000)
    glob = f"{data}/*.idx"
    got = {}
    for name, extra in (("perm", ""), ("list", "shuffle_list_max = 5000000\n")):
        d = daemon(feed_conf(name, glob, seq_len=2048, batch_size=8, window=2, extra=extra))
        out = d.dump(name, tmp_path / name, rank=0, world=2, batches=30)
        got[name] = (anon_mib(d.proc.pid), out)
    print("anonymous MiB", {k: v[0] for k, v in got.items()})
    assert got["perm"][0] < 12, got["perm"][0]
    assert got["list"][0] > got["perm"][0] + 10, (got["list"][0], got["perm"][0])
    # All zeros either way; the order is checked by the other tests, the documents' count here.
    assert got["perm"][1]["input_ids"].shape == (30, 8, 2048)
