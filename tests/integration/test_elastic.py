# SPDX-License-Identifier: MIT
"""Elastic resume (docs/sample-order.md, section 17) with a real feedd.

Megatron feeds, and JSONL feeds tokenized on the way (by a byte-level
tiktoken rank file written here: every byte is its own token, so the
reference knows the ids without a tokenizer).

R ranks run a random number of batches; their states are merged
(feed.merge_states, i.e. libfeed's feed_merge_states); R' ranks resume from
the merged state. Checked, for every packing mode and a mixture:

  * each uninterrupted rank's batches equal the reference's (tests/ref,
    virtual_batches over its one-row streams), bit for bit;
  * across the resize, the multiset of delivered rows equals, for every
    virtual stream v, its first n_v rows (n_v from the final merged state):
    every row exactly once, none skipped, whatever R and R';
  * with R' = R the resumed batches equal the uninterrupted run's.
"""

import collections
import base64
import itertools
import json
import random
import shutil
import subprocess
import zlib

import numpy as np
import pytest

from conftest import feed_conf, feed_ref, gen_megatron, use_feed_package
from test_text import TextShard

V = 16          # virtual_ranks; test_long_states uses 96 (states longer than a cursor)
L, B, SEED, EOS = 64, 4, 11, 7
WEIGHTS = {"web": "0.6", "code": "0.4"}

use_feed_package()
import feed  # noqa: E402


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic")
    for name, n, mean, seed in (("web", 3, 60, 1), ("code", 2, 120, 2)):
        gen_megatron.main([str(d / name), "--shards", str(n), "--docs-per-shard", "60", "--mean-len", str(mean),
                           "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", str(seed)])
    # JSONL: 2 shards of short texts (some empty), and a rank file mapping each byte to itself.
    rnd = random.Random(3)
    words = "the quick brown fox jumps over a lazy dog while feedd packs rows for every virtual rank".split()
    (d / "text").mkdir()
    for i in range(2):
        with open(d / "text" / f"t{i}.jsonl", "w") as f:
            for _ in range(70):
                f.write(json.dumps({"text": " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 30)))}) + "\n")
    (d / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    return d


def text_keys(shards):
    return (f"format = jsonl\nshards = {shards}/text/t*.jsonl\ntokenizer = {shards}/bytes.tiktoken\n"
            f"tokenizer_preset = gpt2\n")


def conf(shards, packing, mixture, kind="megatron", vranks=V):
    extra = f"virtual_ranks = {vranks}\npacking = {packing}\n" + ("pack_buffer = 200\n" if packing == "bestfit" else "")
    cache = f"[feedd]\ncache_dir = {shards}/cache\n"
    if not mixture and kind == "jsonl":
        return (cache + f"[feed.f]\n{text_keys(shards)}seq_len = {L}\nbatch_size = {B}\nseed = {SEED}\n"
                f"shuffle_window = 2\neos = {EOS}\n{extra}")
    if not mixture:
        return feed_conf("f", f"{shards}/web/shard_*.idx", seq_len=L, batch_size=B, seed=SEED, eos=EOS, extra=extra)
    srcs = ", ".join(f"{s}:{w}" for s, w in WEIGHTS.items())
    text = (cache + f"[feed.f]\nsources = {srcs}\nseq_len = {L}\nbatch_size = {B}\nseed = {SEED}\nshuffle = true\n"
            f"shuffle_window = 2\neos = {EOS}\n{extra}")
    for s in WEIGHTS:
        if s == "code" and kind == "jsonl":
            text += f"[feed.f.{s}]\n{text_keys(shards)}"
        else:
            text += f"[feed.f.{s}]\nshards = {shards}/{s}/shard_*.idx\n"
    return text


def text_shards(shards):
    """The JSONL shards as the reference sees them: each byte of a text is its token."""
    return [TextShard([np.frombuffer(json.loads(line)["text"].encode(), np.uint8).astype(np.int32)
                       for line in path.read_text().splitlines()])
            for path in sorted((shards / "text").glob("t*.jsonl"))]


class Ref:
    """The reference's one-row streams of the feed (section 17.1)."""

    def __init__(self, shards, packing, mixture, kind="megatron", vranks=V):
        self.packing, self.mixture = packing, mixture
        names = list(WEIGHTS) if mixture else ["code" if kind == "jsonl" else "web"]
        self.shards = [text_shards(shards) if s == "code" and kind == "jsonl" else
                       feed_ref.load_shards(feed_ref.expand_globs([f"{shards}/{s}/shard_*.idx"])) for s in names]
        self.vranks = feed_ref.effective_vranks(vranks, [sum(s.docs for s in sh) for sh in self.shards])

    def _docs(self, v):
        streams = [feed_ref.rank_documents(feed_ref.RankStream(sh, SEED, True, 2, self.vranks, v, eos=EOS,
                                                               virtual=True)) for sh in self.shards]
        if not self.mixture:
            return streams[0]
        return feed_ref.mixed_documents(streams, SEED, [feed_ref.mix_parse_weight(w) for w in WEIGHTS.values()])

    def rows(self, v, first=0):
        if self.packing == "concat" and not self.mixture:
            rs = feed_ref.RankStream(self.shards[0], SEED, True, 2, self.vranks, v, eos=EOS, virtual=True)
            return rs.batches(L, 1, start_batch=first)
        if self.packing == "concat":
            it = concat_rows(self._docs(v))
        elif self.packing == "pad":
            it = feed_ref.pad_batches(self._docs(v), L, 1, EOS)
        else:
            it = feed_ref.bestfit_batches(self._docs(v), L, 1, 200, EOS)
        return itertools.islice(it, first, None)

    def batches(self, world, rank, n):
        streams = feed_ref.virtual_streams(self.vranks, world, rank)
        return list(itertools.islice(feed_ref.virtual_batches(self.rows, streams, B, L), n))


def concat_rows(documents):
    """Section 14.3's "concat" over a document sequence, one row per batch."""
    toks = itertools.chain.from_iterable(((t, i == 0) for i, t in enumerate(d.tokens.tolist())) for d in documents)
    buf = list(itertools.islice(toks, L + 1))
    while True:
        ids = np.array([t for t, _ in buf], np.int32)
        starts = np.array([s for _, s in buf], bool)
        row = feed_ref.make_batch(ids, starts, 1, L)
        row["epoch"] = 0
        yield row
        buf = buf[L:] + list(itertools.islice(toks, L))


def rows_of(got):
    """A dump's rows, as hashable (input_ids, labels, position_ids) triples."""
    out = []
    for b in range(got["input_ids"].shape[0]):
        for i in range(B):
            out.append((got["input_ids"][b][i].tobytes(), got["labels"][b][i].tobytes(),
                        got["position_ids"][b][i].tobytes()))
    return out


def stream_rows(state):
    """{v: rows delivered} of a global state (section 17.5)."""
    f = state.split("-")
    n, at, out = int(f[6], 16), 7, {}
    for _ in range(n):
        v, ns = int(f[at], 16), int(f[at + 1], 16)
        out[v] = int(f[at + 2], 16)
        at += 2 + (4 + 3 * ns if ns else 5)
    return out


def run_phase(d, tmp_path, tag, world, batches, state):
    rows, last, dumps = [], [], []
    for r in range(world):
        got = d.dump("f", tmp_path / f"{tag}-{r}", rank=r, world=world, batches=batches, cursor=state)
        assert not hasattr(got, "returncode"), got.stderr
        rows += rows_of(got)
        last.append(got["cursors"][-1])
        dumps.append(got)
    return rows, feed.merge_states(last), dumps


MODES = [("concat", False), ("pad", False), ("bestfit", False), ("concat", True)]
WORLDS = [(8, 6), (6, 8), (4, 1), (1, 5), (7, 3), (3, 3), (4, 6, 2)]


@pytest.mark.parametrize("kind", ["megatron", "jsonl"])
@pytest.mark.parametrize("packing,mixture", MODES, ids=[p + ("-mix" if m else "") for p, m in MODES])
@pytest.mark.parametrize("worlds", WORLDS, ids=["-".join(map(str, w)) for w in WORLDS])
def test_resize_delivers_every_row_once(daemon, shards, tmp_path, packing, mixture, worlds, kind):
    rnd = random.Random(zlib.crc32(repr((packing, mixture, worlds, kind)).encode()))
    d = daemon(conf(shards, packing, mixture, kind))
    ref = Ref(shards, packing, mixture, kind)
    counts = [rnd.randint(1, 5) for _ in worlds]

    delivered, state, first_dumps = [], None, None
    for i, (world, n) in enumerate(zip(worlds, counts)):
        rows, state, dumps = run_phase(d, tmp_path, f"p{i}", world, n, state)
        delivered += rows
        first_dumps = first_dumps or dumps

    # The uninterrupted first phase is the reference's, bit for bit.
    for r, got in enumerate(first_dumps):
        exp = ref.batches(worlds[0], r, counts[0])
        for b, e in enumerate(exp):
            for k in ("input_ids", "labels", "position_ids"):
                assert np.array_equal(got[k][b], e[k]), f"rank {r} batch {b}: {k} differs from the reference"
            assert np.array_equal(got["cu_seqlens"][b], e["cu_seqlens"]), f"rank {r} batch {b}: cu_seqlens"

    # Every virtual stream's first n_v rows, each exactly once.
    want = []
    for v, n in stream_rows(state).items():
        for row in itertools.islice(ref.rows(v), n):
            want.append((row["input_ids"][0].tobytes(), row["labels"][0].tobytes(), row["position_ids"][0].tobytes()))
    assert len(delivered) == len(want) == sum(w * n * B for w, n in zip(worlds, counts))
    assert collections.Counter(delivered) == collections.Counter(want)

    if len(worlds) == 2 and worlds[0] == worlds[1]:
        # R' = R: the resumed run is the uninterrupted one.
        total = sum(counts)
        for r in range(worlds[0]):
            whole = d.dump("f", tmp_path / f"whole-{r}", rank=r, world=worlds[0], batches=total)
            resumed = d.dump("f", tmp_path / f"res-{r}", rank=r, world=worlds[0], batches=counts[1],
                             cursor=feed.merge_states([first_dumps[q]["cursors"][-1] for q in range(worlds[0])]))
            for k in ("input_ids", "labels", "position_ids"):
                assert np.array_equal(whole[k][counts[0]:], resumed[k]), f"rank {r}: {k} differs after resuming"


def test_refusals(daemon, shards, tmp_path):
    d = daemon(conf(shards, "concat", False) + feed_conf("g", f"{shards}/web/shard_*.idx", seq_len=L, batch_size=B,
                                                         extra="virtual_ranks = 64\n"))
    got = d.dump("f", tmp_path / "a", rank=0, world=2, batches=2)
    p = d.dump("g", tmp_path / "g", rank=0, world=2, batches=1, cursor=got["cursors"][-1], check=False)
    assert p.returncode != 0 and "another version of feed g" in p.stderr
    p = d.dump("f", tmp_path / "b", rank=0, world=3, batches=1, cursor=got["cursors"][-1], check=False)
    assert p.returncode != 0 and "merge the states of all 2 ranks" in p.stderr
    p = d.dump("f", tmp_path / "c", rank=0, world=V + 1, batches=1, check=False)
    assert p.returncode != 0 and "virtual ranks" in p.stderr
    with pytest.raises(feed.StateError, match="every rank's state"):
        feed.merge_states([got["cursors"][-1]])
    other = d.dump("f", tmp_path / "a1", rank=1, world=2, batches=2)
    both = [got["cursors"][-1], other["cursors"][-1]]
    assert d.ctl("merge", *both).stdout.strip() == feed.merge_states(both) == feed.merge_states(both[::-1])
    p = d.ctl("merge", both[0], both[0], check=False)
    assert p.returncode == 1 and "given twice" in p.stderr


def test_loaders_resize_through_state_dicts(daemon, shards, tmp_path):
    """The trainer's path: feed.Loader state_dicts of 2 ranks, merged, loaded by 3 ranks of a new job."""
    d = daemon(conf(shards, "concat", False))
    ref = Ref(shards, "concat", False)
    old = [feed.Loader("f", rank=r, world_size=2, socket=d.socket, as_numpy=True, copy=True, labels="shifted")
           for r in range(2)]
    got = [[next(ld) for _ in range(3)] for ld in old]
    merged = feed.merge_states([ld.state_dict() for ld in old])
    assert merged["rank"] is None and merged["world_size"] is None and merged["next_batch"] == 3
    for ld in old:
        ld.close()
    new = [feed.Loader("f", rank=r, world_size=3, socket=d.socket, as_numpy=True, copy=True, labels="shifted")
           for r in range(3)]
    for ld in new:
        ld.load_state_dict(merged)
    more = [[next(ld) for _ in range(2)] for ld in new]
    assert all(b.index == 3 + i for bs in more for i, b in enumerate(bs))
    delivered = collections.Counter(np.asarray(b["input_ids"])[i].tobytes() for bs in got + more for b in bs
                                    for i in range(B))
    final = stream_rows(feed.merge_states([ld.state_dict() for ld in new])["cursor"])
    want = collections.Counter(row["input_ids"][0].tobytes() for v, n in final.items()
                               for row in itertools.islice(ref.rows(v), n))
    assert delivered == want and sum(want.values()) == (2 * 3 + 3 * 2) * B
    for ld in new:
        ld.close()


@pytest.mark.parametrize("packing,mixture", MODES, ids=[p + ("-mix" if m else "") for p, m in MODES])
def test_explain_names_what_every_row_holds(daemon, shards, tmp_path, packing, mixture):
    """feedctl explain's provenance, checked against the tokens the same batches hold, after a resize too."""
    d = daemon(conf(shards, packing, mixture))
    names = list(WEIGHTS) if mixture else ["web"]
    loaded = {n: feed_ref.load_shards(feed_ref.expand_globs([f"{shards}/{n}/shard_*.idx"])) for n in names}
    first = d.dump("f", tmp_path / "a", rank=0, world=2, batches=2)
    second = d.dump("f", tmp_path / "b", rank=1, world=2, batches=2)
    state = feed.merge_states([first["cursors"][-1], second["cursors"][-1]])
    for world, rank, cursor in ((2, 1, None), (3, 2, state)):
        got = d.dump("f", tmp_path / f"w{world}", rank=rank, world=world, batches=3, cursor=cursor)
        args = ["explain", "f", "--rank", str(rank), "--world", str(world), "--batches", "3"]
        text = d.ctl(*args, *(["--state", cursor] if cursor else [])).stdout
        covered = 0
        for line in text.splitlines():
            w = line.split()
            kv = dict(zip(w[::2], w[1::2]))
            b, row = int(w[1]) - (int(cursor.split("-")[5], 16) if cursor else 0), int(w[3])  # batch numbers go on
            c0, c1 = map(int, w[5].split("-"))
            t0, t1 = map(int, kv["tokens"].split("-"))
            src = kv.get("source", names[0])
            toks = loaded[src][int(kv["shard"])].doc_tokens(int(kv["doc"]))[t0:t1].tolist()
            if "+eos" in w:
                toks.append(EOS)
            assert got["input_ids"][b][row][c0:c1 + 1].tolist() == toks, line
            assert int(kv["vstream"]) % world == rank
            covered += c1 - c0 + 1
        assert covered <= 3 * B * L and (packing != "concat" or covered == 3 * B * L)


@pytest.mark.parametrize("packing,mixture", [("concat", False), ("bestfit", False), ("concat", True)],
                         ids=["concat", "bestfit", "concat-mix"])
def test_long_states(daemon, shards, tmp_path, packing, mixture):
    """virtual_ranks = 96: one rank's state lists up to 96 streams, far past a cursor's 511 characters; it travels
    in the slot's state area and in STATE messages, through merges, resizes 3 -> 1 -> 5, dump and explain."""
    vr = 96
    d = daemon(conf(shards, packing, mixture, vranks=vr))
    ref = Ref(shards, packing, mixture, vranks=vr)
    delivered, state = [], None
    for i, (world, n) in enumerate(((3, 4), (1, 30), (5, 3))):
        rows, state, dumps = run_phase(d, tmp_path, f"p{i}", world, n, state)
        delivered += rows
        if world == 1:
            assert len(dumps[0]["cursors"][-1]) > 511
    assert len(state) > 511
    want = []
    for v, n in stream_rows(state).items():
        for row in itertools.islice(ref.rows(v), n):
            want.append((row["input_ids"][0].tobytes(), row["labels"][0].tobytes(), row["position_ids"][0].tobytes()))
    assert collections.Counter(delivered) == collections.Counter(want)
    text = d.ctl("explain", "f", "--rank", "0", "--world", "1", "--batches", "1", "--state", state).stdout
    assert len(text.splitlines()) >= B and all(" vstream " in ln for ln in text.splitlines())
    # The Python loader: state_dict() of the long state, loaded again, continues where it was.
    ld = feed.Loader("f", rank=0, world_size=1, socket=d.socket, as_numpy=True, copy=True, labels="shifted")
    ld.load_state_dict({**ld.state_dict(), "cursor": state})
    a = [np.asarray(next(ld)["input_ids"]).copy() for _ in range(3)]
    sd = ld.state_dict()
    assert len(sd["cursor"]) > 511
    b = [np.asarray(next(ld)["input_ids"]).copy() for _ in range(2)]
    ld.load_state_dict(sd)
    assert all(np.array_equal(x, np.asarray(next(ld)["input_ids"])) for x in b)
    ld.close()


def test_long_state_survives_a_daemon_restart(shards, tmp_path):
    """libfeed re-attaches with the last batch's state when feedd comes back, a 2 KB state sent as STATE parts."""
    from conftest import Daemon
    text = conf(shards, "concat", False, vranks=96)
    d = Daemon(tmp_path, text, name="feedd")
    try:
        ld = feed.Loader("f", rank=0, world_size=1, socket=d.socket, as_numpy=True, timeout=60, reconnect_timeout=60,
                         copy=True)
        got = [np.asarray(next(ld)["input_ids"]).copy() for _ in range(40)]
        assert len(ld.state_dict()["cursor"]) > 1000
        d.proc.kill()
        d.proc.wait()
        d = Daemon(tmp_path, text, name="feedd")
        got += [np.asarray(next(ld)["input_ids"]).copy() for _ in range(10)]
        assert ld.stats()["reconnects"] == 1
        ld.close()
        ref = feed.Loader("f", rank=0, world_size=1, socket=d.socket, as_numpy=True, reconnect_timeout=0, copy=True)
        want = [np.asarray(next(ref)["input_ids"]).copy() for _ in range(50)]
        ref.close()
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
    finally:
        d.stop()


def test_long_state_after_a_refused_attach_on_the_same_connection(daemon, shards, tmp_path):
    """STATE parts belong to the ATTACH that follows them even when it is refused: a retry starts clean."""
    import ctypes
    from feed import _lib
    d = daemon(conf(shards, "concat", False, vranks=96))
    state = d.dump("f", tmp_path / "a", rank=0, world=1, batches=30)["cursors"][-1]
    assert len(state) > 511
    c = _lib._P()
    assert _lib.lib.feed_client_connect(d.socket.encode(), ctypes.byref(c)) == 0
    try:
        assert _lib.lib.feed_client_attach(c, b"nope", 0, 1, state.encode()) < 0
        assert b"no feed named" in _lib.lib.feed_client_error(c)
        assert _lib.lib.feed_client_attach(c, b"f", 0, 1, state.encode()) == 0, _lib.lib.feed_client_error(c)
        b = _lib.feed_batch()
        assert _lib.lib.feed_client_next(c, 60000, ctypes.byref(b)) == 0, _lib.lib.feed_client_error(c)
        assert b.index == 30
        want = d.dump("f", tmp_path / "b", rank=0, world=1, batches=1, cursor=state)
        got = np.ctypeslib.as_array(ctypes.cast(b.input_ids, ctypes.POINTER(ctypes.c_int32)), shape=(B, L))
        assert np.array_equal(got, want["input_ids"][0])
        _lib.lib.feed_client_release(c, ctypes.byref(b))
    finally:
        _lib.lib.feed_client_close(c)


@pytest.mark.parametrize("packing,mixture", MODES, ids=[p + ("-mix" if m else "") for p, m in MODES])
def test_virtual_ranks_equal_to_the_world_are_todays_stream(shards, tmp_path, packing, mixture):
    """Section 17.7: with V' = R every rank receives its batches of sections 3-16 bit for bit, so a job started
    without virtual_ranks resumes from its fc1/fc2 cursors once virtual_ranks = R is set (and may resize later)."""
    from conftest import Daemon
    plain = conf(shards, packing, mixture, vranks=0)
    d = Daemon(tmp_path, plain, name="plain")
    try:
        before = [d.dump("f", tmp_path / f"p{r}", rank=r, world=3, batches=6) for r in range(3)]
    finally:
        d.stop()
    d = Daemon(tmp_path, conf(shards, packing, mixture, vranks=3), name="virtual")
    try:
        for r in range(3):
            whole = d.dump("f", tmp_path / f"v{r}", rank=r, world=3, batches=6)
            for k in ("input_ids", "labels", "position_ids"):
                assert np.array_equal(whole[k], before[r][k]), (r, k)
            assert all(np.array_equal(a, b) for a, b in zip(whole["cu_seqlens"], before[r]["cu_seqlens"]))
            # The plain stream's cursor after batch 2 resumes in the virtual feed at batch 3.
            rest = d.dump("f", tmp_path / f"r{r}", rank=r, world=3, batches=3, cursor=before[r]["cursors"][2])
            assert np.array_equal(rest["input_ids"], before[r]["input_ids"][3:]), r
        states = [d.dump("f", tmp_path / f"s{r}", rank=r, world=3, batches=1, cursor=before[r]["cursors"][5])
                  for r in range(3)]
        merged = feed.merge_states([s["cursors"][-1] for s in states])
        assert len(d.dump("f", tmp_path / "g", rank=0, world=2, batches=1, cursor=merged)["input_ids"]) == 1
        # A plain cursor names its world: another one is refused as section 7.3 says.
        p = d.dump("f", tmp_path / "x", rank=0, world=2, batches=1, cursor=before[0]["cursors"][2], check=False)
        assert p.returncode != 0 and "cursor is for rank 0 of world 3, not rank 0 of world 2" in p.stderr, p.stderr
    finally:
        d.stop()
    # feedd's default virtual_ranks (V' = 1024 or the documents, not 3): a cursor saved without virtual ranks
    # resumes exactly the stream it was taken on, and goes on making cursors of it (section 17.7).
    default = conf(shards, packing, mixture, vranks=0).replace("virtual_ranks = 0\n", "# virtual_ranks: default\n")
    d = Daemon(tmp_path, default, name="default")
    try:
        for r in range(3):
            rest = d.dump("f", tmp_path / f"d{r}", rank=r, world=3, batches=3, cursor=before[r]["cursors"][2])
            for k in ("input_ids", "labels", "position_ids"):
                assert np.array_equal(rest[k], before[r][k][3:]), (r, k)
            assert rest["cursors"][-1] == before[r]["cursors"][5], r
        fresh = d.dump("f", tmp_path / "fresh", rank=0, world=3, batches=1)
        assert fresh["cursors"][0].startswith("fv1-")
    finally:
        d.stop()


@pytest.mark.skipif(not shutil.which("zstd"), reason="zstd missing")
def test_virtual_streams_tokenize_about_what_their_batches_hold(daemon, tmp_path):
    """virtual_ranks left at its default (V' = 1,024) over small text shards: each virtual stream has a
    document in about one window of five, and a row of one stream spans more than an epoch. The rank
    tokenizes about the documents of the batches it makes and those ahead of them (not every one of its
    1,024 streams a row ahead for every free slot: 30 times the corpus in 4 batches before), and walks that
    follow one another over the same windows shuffle each window about once (they were built again by
    every walk: hundreds of thousands of builds for a few hundred windows)."""
    n_shards, docs, window, slots, batches, seq = 200, 20, 4, 4, 4, 1024
    rnd = random.Random(5)
    words = "the quick brown fox jumps over a lazy dog while feedd packs rows for every virtual rank".split()
    (tmp_path / "text").mkdir()
    for i in range(n_shards):
        with open(tmp_path / "text" / f"t{i:03d}.jsonl", "w") as f:
            for _ in range(docs):
                f.write(json.dumps({"text": " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 12)))}) + "\n")
    # Compressed, as corpora are: their copies are made on use (text_cache.c), a few shards at a time.
    subprocess.run(["sh", "-c", f"cd {tmp_path}/text && zstd -q --rm *.jsonl"], check=True)
    (tmp_path / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n"
                                                     for i in range(256)))
    d = daemon(f"[feedd]\ncache_dir = {tmp_path}/cache\nring_slots = {slots}\n[feed.f]\nformat = jsonl\n"
               f"# virtual_ranks: feedd's default\nshards = {tmp_path}/text/t*.jsonl.zst\ntokenizer = {tmp_path}/bytes.tiktoken\ntokenizer_preset = gpt2\n"
               f"seq_len = {seq}\nbatch_size = {B}\nseed = {SEED}\nshuffle_window = {window}\neos = {EOS}\n")
    c = d.client("f", 0, 1, batches)  # a trainer's client: its ring's free slots are tokenized ahead
    _, err = c.communicate(timeout=120)
    assert c.returncode == 0, err
    f = d.status()["feeds"][0]
    text, wa = f["text"], f["work_ahead"]
    tokenized = text["documents_tokenized"]
    per_doc = text["tokens_tokenized"] / max(tokenized, 1) + 1  # + eos
    # The batches taken and those the ring's slots tokenize ahead, one more document per row (a row's last
    # document goes on into the next).
    rows = (batches + slots + 1) * B
    held = rows * (seq / per_doc + 1)
    print(f"{tokenized} documents tokenized for {rows} rows of about {held:.0f} documents; "
          f"{wa['windows_built']} window builds for {n_shards // window} windows an epoch")
    assert tokenized <= 3 * held, (tokenized, held, text)
    # Each row spans an epoch and a half: every window of about two epochs, once each, and those built ahead that
    # no walk took: a walk asks for the next window it has a document in, but a window whose shards are not counted
    # yet (text is counted when its window first comes up) is asked for whatever it holds, so at first most
    # prefetches are of windows the asking stream only passes through (measured 195-257 builds, 122 of them evicted
    # unused; 118-129 when every count was known at load). Hundreds of thousands before.
    assert wa["windows_built"] <= 8 * n_shards // window, wa


def test_a_text_resize_on_a_cold_cache_counts_only_from_the_states_windows(daemon, tmp_path):
    """States of a text feed carry each stream's k_w (issue #22): 2 ranks run late into the epoch, their states
    are merged (the <kw> list kept), and 3 ranks resume on another feedd with an empty cache_dir: every row of
    every virtual stream exactly once (the reference's), and the shards before the streams' earliest window are
    not counted."""
    S, first = 120, 50  # shards (windows of 2), batches before the resize
    rnd = random.Random(7)
    words = "the quick brown fox jumps over a lazy dog while feedd packs rows for every virtual rank".split()
    (tmp_path / "text").mkdir()
    for i in range(S):
        with open(tmp_path / "text" / f"t{i:03d}.jsonl", "w") as f:
            for _ in range(12):
                f.write(json.dumps({"text": " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 14)))}) + "\n")
    (tmp_path / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n"
                                                     for i in range(256)))
    text = conf(tmp_path, "concat", False, "jsonl")
    ref = Ref(tmp_path, "concat", False, "jsonl")
    d = daemon(text)
    rows1, state, _ = run_phase(d, tmp_path, "p0", 2, first, None)
    assert d.stop() == 0
    f = state.split("-")
    n = int(f[6], 16)
    kw = f[7 + 7 * n:-1]
    windows = [int(f[7 + 7 * i + 4], 16) for i in range(n)]
    assert n == V and len(kw) == n, state  # one k_w per stream, after the entries
    assert all(int(f[7 + 7 * i + 3], 16) == 0 for i in range(n)) and min(windows) >= S // 8, windows  # epoch 0, late

    # What the resume counts, alone: no background count pass (count_ahead).
    cold = daemon(text.replace(f"cache_dir = {tmp_path}/cache", f"cache_dir = {tmp_path}/cold") + "count_ahead = false\n")
    rows2, final, _ = run_phase(cold, tmp_path, "p1", 3, 3, state)
    indexed = cold.status()["feeds"][0]["work_ahead"]["text_shards_indexed"]
    print(f"resize 2 -> 3 at windows {min(windows)}..{max(windows)} of {S // 2} on a cold cache_dir: "
          f"{indexed} of {S} shards counted")
    assert indexed <= S - 2 * min(windows) + 8, (windows, indexed)
    want = []
    for v, k in stream_rows(final).items():
        for row in itertools.islice(ref.rows(v), k):
            want.append((row["input_ids"][0].tobytes(), row["labels"][0].tobytes(), row["position_ids"][0].tobytes()))
    assert len(rows1) + len(rows2) == len(want) == (2 * first + 3 * 3) * B
    assert collections.Counter(rows1 + rows2) == collections.Counter(want)
    assert cold.stop() == 0

    # The merged state without its <kw> list (made before issue #22) resumes the same rows, and the states after
    # one batch carry the list again, though only 4 of the 5 or 6 streams each rank serves delivered a row since.
    old = "-".join(f[:7 + 7 * n])
    old = f"{old}-{feed_ref.mix(fnv1a(old.encode())) & 0xFFFFFFFF:08x}"
    again = daemon(text.replace(f"cache_dir = {tmp_path}/cache", f"cache_dir = {tmp_path}/cold2"))
    rows3, _, dumps = run_phase(again, tmp_path, "p2", 3, 1, old)
    assert collections.Counter(rows3) == collections.Counter(
        r for d in run_phase(again, tmp_path, "p3", 3, 1, state)[2] for r in rows_of(d))
    for r, got in enumerate(dumps):
        g = got["cursors"][-1].split("-")
        served = (V - r + 2) // 3  # more than the B = 4 rows of a batch
        assert int(g[6], 16) == served > B and len(g) == 7 + 8 * served + 1, got["cursors"][-1]
    assert again.stop() == 0


def fnv1a(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h
