# SPDX-License-Identifier: MIT
"""Text shards indexed only when their window comes up (issue #22), with a real
feedd: load only stats each shard; the first batches index the shards of the
first windows (and a read-ahead), never the corpus; a shard that cannot be
read in a late window fails only when its window comes up, naming the file; a
resume from a cursor late in the epoch on an empty cache_dir indexes only
the windows it reads from there (the cursor carries k_w); the batches are
the same as an uninterrupted run's; anonymous memory at the first batch does
not grow with the number of shards.

Runs with Debian's /usr/bin/python3.
"""

import shutil
import subprocess
import time

import numpy as np
import pytest

from conftest import RSS_IS_FEEDDS
from feed_ref import cursor_check as check_of
from test_scale import text_scale_conf, write_zst_shards

pytestmark = pytest.mark.skipif(not shutil.which("zstd"), reason="zstd missing")


def conf(folder, cache, shuffle="true", window=4, extra="virtual_ranks = 0\n"):
    return text_scale_conf(folder, cache, window=window).replace("shuffle = true", f"shuffle = {shuffle}") + extra


def work(d):
    return d.status()["feeds"][0]


def anon_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


def test_first_batch_indexes_only_the_first_windows_and_a_bad_late_shard_fails_when_reached(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 300, 3)
    # The last shard (window 74 of 75 without shuffle) is not a zstd stream at all.
    bad = folder / "t00299.jsonl.zst"
    bad.write_bytes(b"this is not zstd" * 8)
    # No background count pass (count_ahead, test_text_counts.py): what the walks count, alone.
    d = daemon(conf(folder, tmp_path / "cache", shuffle="false") + "count_ahead = false\n")
    st = work(d)
    assert st["state"] == "ready", st
    wa = st["work_ahead"]
    # Load counted only until it found a document: one shard.
    assert wa["text_shards_indexed"] <= 4 and wa["text_shards_pending"] >= 296, wa
    assert st["documents"] < 300 * 3
    first = d.dump("t", tmp_path / "first", batches=2)
    wa = work(d)["work_ahead"]
    # The windows tokenized ahead and the copy maker's read-ahead (at most 32 shards past them), not 300.
    assert 1 <= wa["text_shards_indexed"] <= 200 and wa["text_shards_pending"] >= 100, wa
    assert first["input_ids"].shape[0] == 2
    # An epoch is ~44 batches: the bad shard's window comes up, and the read fails naming it.
    p = d.dump("t", tmp_path / "all", batches=80, check=False)
    assert not isinstance(p, dict) and p.returncode != 0, "a shard that is not zstd was served"
    assert str(bad) in p.stderr, p.stderr
    st = work(d)
    assert st["state"] == "failed" and str(bad) in st["error"], st


def test_resume_late_on_a_cold_cache_indexes_only_its_windows(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 400, 3)
    d = daemon(conf(folder, tmp_path / "warm"))
    n = 80
    want = d.dump("t", tmp_path / "want", batches=n)
    # Every shard counted: by the walks that read the epoch, or by the background count pass (count_ahead).
    deadline = time.monotonic() + 30
    while work(d)["work_ahead"]["text_shards_pending"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert work(d)["work_ahead"]["text_shards_indexed"] == 400, work(d)
    assert d.stop() == 0
    at = 60
    cursor = want["cursors"][at]
    assert len(cursor.split("-")) == 12, cursor  # fc1 with <data> and <kw>
    d2 = daemon(conf(folder, tmp_path / "cold") + "count_ahead = false\n")  # what the resume counts, alone
    late = d2.dump("t", tmp_path / "late", batches=5, cursor=cursor)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(late[k], want[k][at + 1:at + 6]), k
    wa = work(d2)["work_ahead"]
    # The cursor's window and those after it (tokenizing runs ahead: a 16 KiB chunk spans ~150 of these shards),
    # and a little of the next epoch: never the 4 * window shards before it, which k_w spares counting.
    window = int(cursor.split("-")[6], 16)
    assert window >= 40, cursor
    assert wa["text_shards_indexed"] <= 400 - 4 * window + 40, (window, wa)
    assert d2.stop() == 0
    # A cursor without <kw> (made before issue #22) still resumes, the same batches, counting what it must.
    body = "-".join(cursor.split("-")[:10])
    old = f"{body}-{check_of(body):08x}"
    d3 = daemon(conf(folder, tmp_path / "cold2") + "count_ahead = false\n")
    again = d3.dump("t", tmp_path / "again", batches=5, cursor=old)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(again[k], want[k][at + 1:at + 6]), k
    assert d3.stop() == 0


def test_a_resume_whose_first_chunk_comes_back_last_tokenizes_only_its_windows(daemon, tmp_path, monkeypatch):
    """The walk that hands documents to the workers waits for each window's count, so a cold resume hands out a
    small chunk per window; when the first of them is held up (a loaded machine: FEEDD_TEXT_SLOW_FIRST_CHUNK of
    daemon/feed/worker.c) the ones after it come back first. They count as tokenized ahead: tokenizing stops
    there, instead of running on through the epoch and the next (all 400 shards counted and copied, which a
    loaded full test run once saw in test_resume_late_on_a_cold_cache_indexes_only_its_windows)."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 400, 3)
    d = daemon(conf(folder, tmp_path / "warm"))
    want = d.dump("t", tmp_path / "want", batches=80)
    assert d.stop() == 0
    at = 60
    cursor = want["cursors"][at]
    window = int(cursor.split("-")[6], 16)
    assert window >= 40, cursor
    monkeypatch.setenv("FEEDD_TEXT_SLOW_FIRST_CHUNK", "2000")
    d2 = daemon(conf(folder, tmp_path / "cold") + "count_ahead = false\n")
    late = d2.dump("t", tmp_path / "late", batches=5, cursor=cursor)
    same_batches(late, want, at + 1, at + 6)
    wa = work(d2)["work_ahead"]
    print(f"resume at window {window} of 100, its first chunk 2 s late: {wa['text_shards_indexed']} of 400 shards "
          f"counted, {wa['text_copies_made']} copies made")
    assert wa["text_shards_indexed"] <= 400 - 4 * window + 40, (window, wa)
    assert wa["text_copies_made"] <= 400 - 4 * window + 80, (window, wa)
    assert d2.stop() == 0


@pytest.mark.skipif(not RSS_IS_FEEDDS, reason="feedd's RSS is not its own under a wrapper or ASan")
def test_anonymous_memory_at_the_first_batch_does_not_grow_with_the_shards(daemon, tmp_path):
    rss = {}
    for n in (1000, 4000):
        folder = tmp_path / f"zst{n}"
        write_zst_shards(folder, n, 3)
        d = daemon(conf(folder, tmp_path / f"cache{n}"))
        d.dump("t", tmp_path / f"out{n}", batches=1)
        rss[n] = anon_kib(d.proc.pid)
        assert d.stop() == 0
    grow = rss[4000] - rss[1000]
    print(f"anonymous RSS at the first batch: 1000 shards {rss[1000]} KiB, 4000 shards {rss[4000]} KiB")
    # A few hundred bytes of metadata per shard (its path, identity and cache names), nothing per document.
    assert grow < 3000 * 4, rss


def test_a_warm_restart_reads_the_counts_kept_in_cache_dir(daemon, tmp_path):
    folder = tmp_path / "zst"
    write_zst_shards(folder, 200, 3)
    cache = tmp_path / "cache"
    d = daemon(conf(folder, cache))
    want = d.dump("t", tmp_path / "want", batches=50)  # past epoch 0: every shard counted
    st = work(d)
    assert st["work_ahead"]["text_shards_pending"] == 0 and st["documents"] == 600, st
    assert d.stop() == 0
    assert [p for p in cache.iterdir() if p.name.startswith("counts-")], list(cache.iterdir())
    d = daemon(conf(folder, cache))
    st = work(d)
    wa = st["work_ahead"]
    # Known at READY, without reading a shard: the totals and every window's start.
    assert st["documents"] == 600 and wa["text_shards_pending"] == 0 and wa["text_counts_from_cache"] == 200, st
    assert "200 of them from cache_dir" in d.log_text()
    again = d.dump("t", tmp_path / "again", batches=50)
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(again[k], want[k]), k
    assert d.stop() == 0
    # A shard rewritten since is counted again; the others' counts still come from the file.
    (folder / "t00007.jsonl.zst").touch()
    d = daemon(conf(folder, cache))
    wa = work(d)["work_ahead"]
    assert wa["text_counts_from_cache"] == 199 and wa["text_shards_pending"] <= 1, wa
    assert d.stop() == 0


def test_two_epochs_with_shards_held_per_window_equal_a_fresh_resume(daemon, tmp_path):
    """Two epochs over 400 shards: the shards are held while a stream's walk is in their window and let go after
    (their indexes kept up to TEXT_UNHELD_MAX / _BYTES, far above this corpus); epoch 1's batches equal those of
    a fresh resume there on a cold cache_dir. Shards of 100 documents, so that tokenizing ahead spans a few."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 400, 100)

    def big(cache):
        return conf(folder, cache).replace("seq_len = 128", "seq_len = 1024").replace("batch_size = 4", "batch_size = 16")

    d = daemon(big(tmp_path / "a"))
    n = 220  # an epoch is ~90 batches
    whole = d.dump("t", tmp_path / "whole", batches=n)
    wa = work(d)["work_ahead"]
    assert wa["text_shards_indexed"] == 400 and 1 <= wa["text_indexes_in_memory"] <= 400, wa
    assert d.stop() == 0
    at = 150  # in epoch 1
    d2 = daemon(big(tmp_path / "b"))
    rest = d2.dump("t", tmp_path / "rest", batches=n - at - 1, cursor=whole["cursors"][at])
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(rest[k], whole[k][at + 1:]), k
    assert d2.stop() == 0


def test_indexes_let_go_and_built_again_under_virtual_ranks_keep_the_stream(daemon, tmp_path, monkeypatch):
    """Indexes let go as soon as no walk holds them (FEEDD_TEXT_UNHELD_MAX = 0, a test hook of text.c's bound)
    while 32 virtual streams walk 40 plain and compressed shards in windows of 2: the streams' tokenizing
    ahead (its walk holds the shards it hands out too) and the workers read shards whose index other streams
    let go meanwhile, built again when needed; the batches equal those of a feedd with the default bounds
    (indexes kept), and feedd stops cleanly."""
    folder = tmp_path / "mixed"
    write_zst_shards(folder, 40, 30)
    for p in sorted(folder.glob("t*.jsonl.zst"))[::2]:
        subprocess.run(["zstd", "-q", "-d", "--rm", str(p)], check=True)

    def c(cache):
        return conf(folder, cache, window=2, extra="virtual_ranks = 32\n").replace("t*.jsonl.zst", "t*.jsonl*")

    n = 80  # about three epochs
    d = daemon(c(tmp_path / "a"))
    ref = d.dump("t", tmp_path / "ref", batches=n)
    assert d.stop() == 0
    monkeypatch.setenv("FEEDD_TEXT_UNHELD_MAX", "0")
    d2 = daemon(c(tmp_path / "b"))
    got = d2.dump("t", tmp_path / "got", batches=n)
    wa = work(d2)["work_ahead"]
    assert wa["text_indexes_in_memory"] < wa["text_shards_indexed"], wa
    assert d2.stop() == 0
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], ref[k]), k


def with_check(fields):
    """A cursor or state text from its '-'-separated fields before the check, with the check appended."""
    body = "-".join(fields)
    return f"{body}-{check_of(body):08x}"


def mix_conf(a, b, cache, ahead=True, shuffle=True, window=4):
    """A mixture of two text sources of .jsonl.zst shards (fc2 cursors: virtual ranks off); ahead: count_ahead of
    each source (off: what the walks count, alone)."""
    head = text_scale_conf(a, cache).split("[feed.t]")[0]
    text = (f"{head}[feed.m]\nsources = a:0.5, b:0.5\nseq_len = 128\nbatch_size = 4\nseed = 3\n"
            f"shuffle = {'true' if shuffle else 'false'}\nshuffle_window = {window}\neos = 10\nvirtual_ranks = 0\n")
    for name, folder in (("a", a), ("b", b)):
        text += (f"[feed.m.{name}]\nformat = jsonl\nshards = {folder}/t*.jsonl.zst\ntokenizer = {folder}/bytes.tiktoken\n"
                 f"tokenizer_preset = gpt2\ncount_ahead = {'true' if ahead else 'false'}\n")
    return text


def same_batches(got, want, lo, hi):
    for k in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[k], want[k][lo:hi]), k


def test_a_mixture_of_text_sources_resumes_late_on_a_cold_cache_counting_only_its_windows(daemon, tmp_path):
    """fc2 carries each source's k_w (issue #22): a resume late in the epoch on an empty cache_dir counts only the
    windows of each source's position and those after it, delivers the uninterrupted run's batches, an fc2 made
    before (without <kw>) still resumes the same, and a <kw> that disagrees with the counts known is refused,
    naming the field."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_zst_shards(a, 400, 3)
    write_zst_shards(b, 400, 3)
    d = daemon(mix_conf(a, b, tmp_path / "warm"))
    want = d.dump("m", tmp_path / "want", batches=130)
    at = 120
    cursor = want["cursors"][at]
    f = cursor.split("-")
    # fc2 of two sources: 8 fields, 2 triples, <data>, one <kw> per source, <check>.
    assert f[0] == "fc2" and int(f[8], 16) == 2 and len(f) == 9 + 6 + 1 + 2 + 1, cursor
    windows = [int(f[10], 16), int(f[13], 16)]
    assert min(windows) >= 40 and int(f[9], 16) == int(f[12], 16) == 0, cursor  # late in epoch 0 of both
    # A <kw> off by one: the daemon knows every count (the warm run read them): refused, naming the field.
    bad = d.dump("m", tmp_path / "bad", batches=1, check=False,
                 cursor=with_check(f[:16] + [format(int(f[16], 16) + 1, "x")] + f[17:18]))
    assert not isinstance(bad, dict) and bad.returncode != 0 and "<kw>" in bad.stderr, bad
    assert d.stop() == 0

    d2 = daemon(mix_conf(a, b, tmp_path / "cold", ahead=False))  # what the resume counts, alone
    late = d2.dump("m", tmp_path / "late", batches=5, cursor=cursor)
    same_batches(late, want, at + 1, at + 6)
    indexed = work(d2)["work_ahead"]["text_shards_indexed"]
    print(f"fc2 resume at windows {windows} of 100 (both sources) on a cold cache_dir: {indexed} of 800 shards counted")
    # Each source's window and those after it (plus tokenizing ahead): not the 4 * w shards before each position.
    assert indexed <= sum(400 - 4 * w for w in windows) + 80, (windows, indexed)
    assert d2.stop() == 0

    # The same cursor without <kw> (an fc2 made before issue #22) resumes the same, counting what it must.
    d3 = daemon(mix_conf(a, b, tmp_path / "cold2", ahead=False))
    old = d3.dump("m", tmp_path / "old", batches=5, cursor=with_check(f[:16]))
    same_batches(old, want, at + 1, at + 6)
    print(f"the same without <kw>: {work(d3)['work_ahead']['text_shards_indexed']} counted")
    assert work(d3)["work_ahead"]["text_shards_indexed"] >= sum(4 * w for w in windows)
    assert d3.stop() == 0


def state_parts(state):
    """(head fields, entries, <kw> list) of an fv1 state of a feed of one stream (section 17.5)."""
    f = state.split("-")
    n = int(f[6], 16)
    entries = [f[7 + 7 * i:14 + 7 * i] for i in range(n)]
    return f[:7], entries, f[7 + 7 * n:-1]


def test_an_elastic_text_state_resumes_late_on_a_cold_cache_counting_only_its_windows(daemon, tmp_path):
    """fv1 states carry every stream's k_w (issue #22): a rank serving 4 virtual streams resumes late in the
    epoch on an empty cache_dir counting only the windows from its streams' earliest position on, with the
    uninterrupted run's batches; a state made before (no <kw> list) still resumes the same; and the merge of
    the states of two ranks keeps the list."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 400, 3)
    vconf = lambda cache: conf(folder, cache, extra="virtual_ranks = 4\n")  # noqa: E731
    d = daemon(vconf(tmp_path / "warm"))
    want = d.dump("t", tmp_path / "want", batches=80)
    at = 60
    state = want["cursors"][at]
    head, entries, kw = state_parts(state)
    assert head[0] == "fv1" and len(entries) == 4 and len(kw) == 4, state
    windows = [int(e[4], 16) for e in entries]
    assert all(int(e[3], 16) == 0 for e in entries) and min(windows) >= 40, state  # late in epoch 0
    # A tampered <kw> of one stream, the counts known: refused, naming the stream and the field.
    kw_bad = [format(int(kw[0], 16) + 1, "x")] + kw[1:]
    bad = d.dump("t", tmp_path / "bad", batches=1, check=False,
                 cursor=with_check(head + sum(entries, []) + kw_bad))
    assert not isinstance(bad, dict) and bad.returncode != 0 and "<kw>" in bad.stderr, bad
    # Two ranks' states merged (feedctl's merge is libfeed's) keep the list: world 2 at the same step.
    halves = [d.dump("t", tmp_path / f"r{r}", rank=r, world=2, batches=at // 2 + 1)["cursors"][at // 2]
              for r in (0, 1)]
    merged = d.ctl("merge", *halves).stdout.strip()
    _, m_entries, m_kw = state_parts(merged)
    assert len(m_kw) == len(m_entries) == 4 and sorted(m_kw) == sorted(state_parts(halves[0])[2] +
                                                                         state_parts(halves[1])[2]), merged
    assert d.stop() == 0

    d2 = daemon(vconf(tmp_path / "cold") + "count_ahead = false\n")  # what the resume counts, alone
    # On a cold cache_dir the same <kw> cannot be compared with counts, but ownership in its window depends on
    # k_w mod V' (section 7.3): off by one, the stream's <index> names none of its documents: refused too.
    bad = d2.dump("t", tmp_path / "bad2", batches=1, check=False, cursor=with_check(head + sum(entries, []) + kw_bad))
    assert not isinstance(bad, dict) and bad.returncode != 0 and "does not name a position of virtual stream" in \
        bad.stderr, bad
    late = d2.dump("t", tmp_path / "late", batches=5, cursor=state)
    same_batches(late, want, at + 1, at + 6)
    indexed = work(d2)["work_ahead"]["text_shards_indexed"]
    print(f"fv1 resume at windows {windows} of 100 on a cold cache_dir: {indexed} of 400 shards counted")
    assert indexed <= 400 - 4 * min(windows) + 40, (windows, indexed)
    assert d2.stop() == 0

    d3 = daemon(vconf(tmp_path / "cold2") + "count_ahead = false\n")
    old = d3.dump("t", tmp_path / "old", batches=5, cursor=with_check(head + sum(entries, [])))
    same_batches(old, want, at + 1, at + 6)
    print(f"the same without <kw>: {work(d3)['work_ahead']['text_shards_indexed']} counted")
    assert work(d3)["work_ahead"]["text_shards_indexed"] >= 4 * min(windows)
    assert d3.stop() == 0


def test_a_compressed_shard_is_decompressed_once_on_first_use(daemon, tmp_path):
    """Issue #22: the pass that indexes a compressed shard when its window comes up keeps its copy too (in memory
    for a small shard, in cache_dir for one of more than TEXT_MEM_MAX = 4 MiB of text), so that a cold epoch
    decompresses each shard once (work_ahead.text_decompressions), not once to index it and again to copy it.
    Three epochs over 24 shards, two of them large (their documents padded by 5 MiB of blank lines, which are
    not documents), without the background count pass: 24 decompressions and 24 copies, all for epoch 0 (the
    copies stay open and idle after; load keeps the copy of the small shard it counts, in memory); the batches equal those of the same corpus uncompressed, bit for bit,
    and those under a cache_max_bytes of little more than the two large copies."""
    folder = tmp_path / "zst"
    write_zst_shards(folder, 24, 3)
    pad = (" " * 1023 + "\n") * (5 << 9)  # twice: 5 MiB
    for i in (5, 17):
        p = folder / f"t{i:05d}.jsonl"
        subprocess.run(["zstd", "-q", "-d", "--rm", str(p) + ".zst"], check=True)
        lines = p.read_text().splitlines(keepends=True)
        p.write_text(lines[0] + pad + "".join(lines[1:]) + pad)
        subprocess.run(["zstd", "-q", "--rm", str(p)], check=True)
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    subprocess.run(["sh", "-c", f"cd {plain} && zstd -q -d --rm *.zst"], check=True)

    def c(cache, shards="t*.jsonl.zst", cap=0):
        return (text_scale_conf(folder, cache, cap=cap).replace("t*.jsonl.zst", shards) +
                "virtual_ranks = 0\ncount_ahead = false\n")

    n = 12  # an epoch is ~4 batches
    d = daemon(c(tmp_path / "cache"))
    # Load counts the first shard (until a document is known), a small one: its copy kept in memory.
    at_load = work(d)["work_ahead"]
    assert at_load["text_shards_indexed"] == at_load["text_decompressions"] == at_load["text_copies_made"] == 1, at_load
    got = d.dump("t", tmp_path / "got", batches=n)
    wa = work(d)["work_ahead"]
    print(f"24 shards, 3 epochs: {wa['text_decompressions']} decompressions, {wa['text_copies_made']} copies")
    assert wa["text_shards_indexed"] == 24, wa
    assert wa["text_decompressions"] == 24 and wa["text_copies_made"] == 24, wa
    assert d.stop() == 0
    d = daemon(c(tmp_path / "plain-cache", shards=f"../plain/t*.jsonl"))
    want = d.dump("t", tmp_path / "want", batches=n)
    assert d.stop() == 0
    same_batches(got, want, 0, n)
    d = daemon(c(tmp_path / "capped", cap=11 << 20))
    capped = d.dump("t", tmp_path / "capped-out", batches=n)
    assert d.stop() == 0
    same_batches(capped, want, 0, n)
