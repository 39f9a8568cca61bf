# SPDX-License-Identifier: MIT
"""len(feed.Loader): this rank's batches in the current epoch (docs/sample-order.md, section 16).

A real feedd, real shards and the Python loader, against the independent
reference (tests/ref/feed_ref.py): for several ranks, worlds, seeds, shuffle
windows, bos/eos and both packings that know it ("concat", "pad"), the
reference's stream is cut into batches and the batches whose epoch is e are
counted; len(loader) must equal that count for the epoch of the next batch,
at the start, after every batch across several epochs, and after resuming
from a state_dict. Feeds that cannot know it (bestfit, mixtures, text) raise
TypeError saying why and naming max_steps.

Runs with Debian's /usr/bin/python3.
"""

import collections
import itertools
import os
import shutil

import pytest

from conftest import BUILD, feed_conf, feed_ref, gen_megatron, use_feed_package

os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
use_feed_package()
import feed  # noqa: E402

L, B = 16, 2
EPOCHS = 3  # checked; the reference is laid out one epoch further


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Small u16 shards (empty and multi-sequence documents, some longer than a row) so epochs are short."""
    d = tmp_path_factory.mktemp("epochlen")
    gen_megatron.main([str(d), "--shards", "5", "--docs-per-shard", "24", "--mean-len", "20", "--empty-frac", "0.1",
                       "--multi-seq-frac", "0.2", "--seed", "5"])
    return d


def ref_epochs(glob, packing, rank, world, seed, shuffle, window, bos, eos, n):
    """The epoch of each of the reference's first n batches of this rank."""
    rs = feed_ref.RankStream(feed_ref.load_shards(feed_ref.expand_globs([str(glob)])), seed, shuffle, window, world,
                             rank, bos=bos, eos=eos)
    if packing == "concat":
        batches = rs.batches(L, B, count=n)
    else:
        batches = feed_ref.pad_batches(feed_ref.rank_documents(rs), L, B, 0)
    return [b["epoch"] for b in itertools.islice(batches, n)]


CASES = [  # packing, rank, world, seed, shuffle, window, bos, eos
    ("concat", 0, 1, 7, True, 2, None, 50256),
    ("concat", 2, 3, 11, True, 1, None, None),
    ("concat", 1, 2, 3, False, 3, 50255, 50256),
    ("concat", 3, 4, 0, True, 5, 50255, None),
    ("pad", 0, 2, 7, True, 2, None, 50256),
    ("pad", 2, 3, 9, False, 1, 50255, 50256),
    ("pad", 0, 1, 1, True, 3, None, None),
]


def case_conf(name, glob, packing, seed, shuffle, window, bos, eos, vranks=0):
    tok = lambda t: "none" if t is None else str(t)  # noqa: E731
    return feed_conf(name, glob, seq_len=L, batch_size=B, seed=seed, shuffle="true" if shuffle else "false",
                     window=window, bos=tok(bos), eos=tok(eos), extra=f"packing = {packing}\n", vranks=vranks)


@pytest.mark.parametrize("packing,rank,world,seed,shuffle,window,bos,eos", CASES)
def test_len_is_the_reference_count_of_the_current_epoch(daemon, shards, packing, rank, world, seed, shuffle,
                                                         window, bos, eos):
    glob = f"{shards}/shard_*.idx"
    d = daemon(case_conf("f", glob, packing, seed, shuffle, window, bos, eos))
    # Enough batches to cover EPOCHS epochs and the start of the next.
    n = 64
    while True:
        epochs = ref_epochs(glob, packing, rank, world, seed, shuffle, window, bos, eos, n)
        if epochs[-1] > EPOCHS:
            break
        n *= 2
    count = collections.Counter(epochs)
    first = {e: epochs.index(e) for e in count}
    last = max(i for i, e in enumerate(epochs) if e < EPOCHS)

    loader = feed.Loader("f", rank=rank, world_size=world, socket=d.socket, as_numpy=True, copy=True)
    seen = set()
    for i in range(last + 1):
        e = epochs[i]  # the epoch of the next batch
        assert len(loader) == count[e], f"before batch {i} (epoch {e})"
        info = loader.epoch_info()
        assert (info["epoch"], info["first_batch"], info["remaining"]) == (e, first[e], first[e] + count[e] - i)
        seen.add(e)
        b = next(loader)
        assert (b.index, b.epoch) == (i, e)
    assert seen == set(range(EPOCHS)) - {e for e in range(EPOCHS) if e not in count}, seen
    assert len(seen) >= 2

    # Resumed mid-epoch from a state: the same count, measured from the cursor.
    state = loader.state_dict()
    loader.close()
    again = feed.Loader("f", rank=rank, world_size=world, socket=d.socket, as_numpy=True, copy=True)
    again.load_state_dict(state)
    e = epochs[last + 1]
    assert len(again) == count[e] and again.epoch_info()["first_batch"] == first[e]
    assert next(again).index == last + 1
    again.close()


def test_len_with_torch_dataloader_and_before_the_first_batch(daemon, shards):
    torch = pytest.importorskip("torch")
    glob = f"{shards}/shard_*.idx"
    d = daemon(case_conf("f", glob, "concat", 7, True, 2, None, 50256))
    epochs = ref_epochs(glob, "concat", 1, 2, 7, True, 2, None, 50256, 400)
    loader = feed.Loader("f", rank=1, world_size=2, socket=d.socket)
    dl = torch.utils.data.DataLoader(loader, batch_size=None, num_workers=0)
    assert len(dl) == len(loader) == epochs.count(epochs[0])
    loader.close()


def test_feeds_that_cannot_know_raise_type_error(daemon, shards, tmp_path):
    glob = f"{shards}/shard_*.idx"
    conf = (feed_conf("bf", glob, seq_len=L, batch_size=B, eos="50256", extra="packing = bestfit\n")
            + f"[feed.mix]\nsources = a:0.5, b:0.5\nseq_len = {L}\nbatch_size = {B}\nseed = 1\nshuffle = true\n"
            f"shuffle_window = 2\neos = 50256\n[feed.mix.a]\nshards = {glob}\n[feed.mix.b]\nshards = {glob}\n")
    d = daemon(conf)
    for name, why in (("bf", "bestfit"), ("mix", "mixture")):
        loader = feed.Loader(name, socket=d.socket, as_numpy=True, copy=True)
        with pytest.raises(TypeError, match=f"{why}.*max_steps"):
            len(loader)
        # The connection is still good: batches keep coming, and len() still answers the same way.
        assert next(loader).index == 0
        with pytest.raises(TypeError):
            len(loader)
        # Something that only asks for a length hint is not disturbed.
        assert list(itertools.islice(loader, 2))[1].index == 2
        loader.close()


def test_a_text_feed_raises_type_error(daemon, tmp_path):
    ranks = BUILD / "tokdata" / "ranks" / "cl100k_base.tiktoken"
    if not ranks.exists() or not shutil.which("zstd"):
        pytest.skip("tokenizer data missing (scripts/fetch-tok-data.sh)")
    (tmp_path / "a.txt").write_text("".join(f"document {i} says hello\n" for i in range(50)))
    d = daemon(f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n[feed.t]\nformat = text\nshards = {tmp_path}/a.txt\n"
               f"tokenizer = {ranks}\ntokenizer_preset = cl100k_base\nseq_len = {L}\nbatch_size = {B}\n"
               "eos = <|endoftext|>\n")
    loader = feed.Loader("t", socket=d.socket, as_numpy=True, copy=True)
    with pytest.raises(TypeError, match="tokenizes.*max_steps"):
        len(loader)
    loader.close()


def test_a_cursor_of_another_stream_is_refused_and_the_stream_goes_on(daemon, shards):
    """EPOCH_INFO through libfeed: a cursor of another rank, or a damaged one, is -EINVAL; the attachment lives on."""
    import ctypes
    import errno
    from feed import _lib
    glob = f"{shards}/shard_*.idx"
    d = daemon(case_conf("f", glob, "concat", 7, True, 2, None, 50256))
    other = feed.Loader("f", rank=1, world_size=2, socket=d.socket, as_numpy=True, copy=True)
    foreign = next(other).cursor
    other.close()
    loader = feed.Loader("f", rank=0, world_size=2, socket=d.socket, as_numpy=True, copy=True)
    conn = loader._conn
    out = _lib.feed_epoch_info()
    for cursor, why in ((foreign, "not one of rank 0"), (foreign[:-1] + ("1" if foreign[-1] == "0" else "0"), "malformed")):
        r = _lib.lib.feed_client_epoch_info(conn.ptr, cursor.encode(), ctypes.byref(out))
        assert r == -errno.EINVAL and why in conn.error(), (r, conn.error())
    assert next(loader).index == 0 and len(loader) > 0
    loader.close()


# Virtual ranks (docs/sample-order.md, section 17.10): the rank's batches take their rows from
# several one-row streams; the epoch of a batch is its row 0's, and the batches "in epoch e" are
# those from F(e), the first whose row 0 is of epoch e or later, up to F(e + 1).

VCASES = [  # packing, virtual_ranks, world, rank, seed, shuffle, window, bos, eos
    ("concat", 8, 3, 1, 7, True, 2, None, 50256),
    ("concat", 5, 1, 0, 3, False, 3, 50255, 50256),
    ("pad", 8, 2, 1, 9, True, 1, None, 50256),
    ("concat", 1024, 4, 3, 1, True, 5, None, None),  # feedd's default; V' = N = 120 (section 17.1)
]
N_DOCS = 5 * 24


def vrow_epochs(glob, packing, vranks, v, seed, shuffle, window, bos, eos, upto):
    """The epoch of each row of virtual stream v (rank v of world V', B = 1) until past epoch `upto`;
    None for a dead stream (section 17.4)."""
    rs = feed_ref.RankStream(feed_ref.load_shards(feed_ref.expand_globs([str(glob)])), seed, shuffle, window, vranks,
                             v, bos=bos, eos=eos, virtual=True)
    rows = rs.batches(L, 1) if packing == "concat" else feed_ref.pad_batches(feed_ref.rank_documents(rs), L, 1, 0)
    out = []
    try:
        for row in rows:
            out.append(row["epoch"])
            if row["epoch"] > upto:
                return out
    except RuntimeError:
        return None


def state_rows(state):
    """{v: rows delivered} of an fv1 state (section 17.5; one-stream feeds)."""
    f = state.split("-")
    n, at, out = int(f[6], 16), 7, {}
    for _ in range(n):
        out[int(f[at], 16)] = int(f[at + 2], 16)
        at += 7
    return out


def asked(loader):
    """EPOCH_INFO at the loader's state, not its cached answer."""
    loader._epoch_len = None
    info = loader.epoch_info()
    return info["epoch"], info["first_batch"], info["batches"]


@pytest.mark.parametrize("packing,vranks,world,rank,seed,shuffle,window,bos,eos", VCASES)
def test_len_with_virtual_ranks_fresh_and_resumed(daemon, shards, packing, vranks, world, rank, seed, shuffle, window,
                                                  bos, eos):
    glob = f"{shards}/shard_*.idx"
    conf = case_conf("f", glob, packing, seed, shuffle, window, bos, eos, vranks=None if vranks == 1024 else vranks)
    d = daemon(conf)
    vp = feed_ref.effective_vranks(vranks, [N_DOCS])
    rows = {v: vrow_epochs(glob, packing, vp, v, seed, shuffle, window, bos, eos, EPOCHS + 2)
            for v in range(vp)}
    rows = {v: r for v, r in rows.items() if r is not None}
    mine = {v: rows[v] for v in feed_ref.virtual_streams(vp, world, rank) if v in rows}

    # An uninterrupted run: every answer is the reference's, and the definition holds on the delivered batches.
    loader = feed.Loader("f", rank=rank, world_size=world, socket=d.socket, as_numpy=True, copy=True)
    answers, epochs = [], []
    i = 0
    while not answers or answers[-1][0] < EPOCHS:
        state = loader.state_dict()["cursor"]
        got = asked(loader)
        assert got == feed_ref.virtual_epoch_info(mine, B, state_rows(state) if state else None, i), f"batch {i}"
        answers.append(got)
        b = next(loader)
        assert b.index == i
        epochs.append(b.epoch)
        i += 1
    loader.close()
    running = list(itertools.accumulate(epochs, max))
    for i, (e, first, n) in enumerate(answers[:-1]):
        if first + n <= len(running):
            assert running[i] == e and running.index(e) == first and running.count(e) == n, i
    assert len({a[0] for a in answers}) >= 2

    # Resumed in another world from the merged states of every rank: the reference at the merged state, then at
    # the rank's own states while its streams catch up (section 17.3).
    old = 2 if world != 2 else 3
    states = []
    for r in range(old):
        ld = feed.Loader("f", rank=r, world_size=old, socket=d.socket, as_numpy=True, copy=True)
        for _ in range(5 + 3 * r):  # ranks stopped at different steps
            next(ld)
        states.append(ld.state_dict())
        ld.close()
    merged = feed.merge_states(states)
    again = feed.Loader("f", rank=rank, world_size=world, socket=d.socket, as_numpy=True, copy=True)
    again.load_state_dict(merged)
    start = {v: n for v, n in state_rows(merged["cursor"]).items() if v in mine}
    nb = merged["next_batch"]
    assert asked(again) == feed_ref.virtual_epoch_info(mine, B, start, nb)
    for k in range(12):
        b = next(again)
        assert b.index == nb + k
        state = again.state_dict()["cursor"]
        assert asked(again) == feed_ref.virtual_epoch_info(mine, B, state_rows(state), nb + k + 1), k
    again.close()
