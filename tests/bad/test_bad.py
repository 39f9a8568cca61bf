# SPDX-License-Identifier: MIT
"""Every input of the bad-input corpus (gen_bad.py) and what it must produce.

Outcomes are of two kinds, and each case says which:
- fail, naming the file and the position (byte offset, field and index, or
  config line), while the daemon keeps serving everything else;
- skip and count (zero-length documents, an empty shard among good ones).
Nothing crashes: every daemon in this file must stop cleanly on SIGTERM.

Runs with Debian's /usr/bin/python3 and the integration fixtures.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "integration"))
sys.path.insert(0, str(HERE))
from conftest import BUILD, FEEDD, daemon, feed_conf, reference, wait_attached  # noqa: E402,F401  (daemon is a fixture)
import gen_bad  # noqa: E402

TOK_CHECK = BUILD / "tests" / "bad" / "tok-check"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("bad")
    gen_bad.main([str(out)])
    return out


# Damaged shards: each fails its feed at load with this text (after "<dir>/s.idx: " unless it names the .bin).
SHARD_FAILURES = {
    "idx-truncated-header": "s.idx: truncated header (20 bytes, need 34)",
    "idx-truncated-arrays": "s.idx: size 154 does not match S=6 D=7: expected 162 (or 168 with mode bytes)",
    "bad-magic": "s.idx: bad magic (not a Megatron MMIDIDX index)",
    "bad-version": "s.idx: version 2 at offset 9, only version 1 is supported",
    "unknown-dtype": "s.idx: unknown dtype code 99 at offset 17",
    "float-dtype": "s.idx: dtype f64 (code 6, offset 17) is not an integer token type",
    "bin-shorter-than-idx": "s.idx: sequence 5 (pointer 212, length 29) ends at byte 270, past the end of "
                            "{dir}/s.bin (268 bytes)",
    "pointer-past-end": "s.idx: sequence 5 (pointer 278, length 22) ends at byte 322, past the end of "
                        "{dir}/s.bin (278 bytes)",
    "pointer-overlap": "s.idx: pointers[3] = 0 overlaps the previous sequence (ends at 124)",
    "negative-length": "s.idx: lengths[2] = -3 is negative",
    "doc-index-non-monotone": "s.idx: doc_idx[2] = 0 is outside doc_idx[1] = 1 .. S = 6 (must be monotone)",
    "doc-index-short-of-s": "s.idx: doc_idx[6] = 2, must equal S = 6",
    "missing-bin": "s.bin: cannot open: No such file or directory",
    "empty-shard": "the shards hold no tokens (0 documents, all empty)",
    "only-empty-documents": "the shards hold no tokens (3 documents, all empty)",
}


def small(name, shards, **kw):
    return feed_conf(name, shards, seq_len=16, batch_size=2, **kw)


def test_damaged_shards_fail_their_feed_naming_file_and_position(daemon, corpus, tmp_path):
    conf = small("good", f"{corpus}/shards/good/shard_*.idx") + "".join(
        "\n" + small(case, f"{corpus}/shards/{case}/s.idx") for case in SHARD_FAILURES)
    d = daemon(conf)
    feeds = {f["name"]: f for f in d.status()["feeds"]}
    log = d.log_text()
    for case, text in SHARD_FAILURES.items():
        want = text.replace("{dir}", f"{corpus}/shards/{case}")
        if want.startswith("s."):
            want = f"{corpus}/shards/{case}/{want}"
        f = feeds[case]
        assert f["state"] == "failed", case
        assert want in f["error"], f"{case}: status says {f['error']!r}, want {want!r}"
        assert want in log, f"{case}: not logged"
        p = d.dump(case, tmp_path / case, batches=1, check=False)
        assert p.returncode == 1 and want in p.stderr, f"{case}: attach said {p.stderr!r}"
    # Everything else is served as if the broken feeds were not there.
    assert feeds["good"]["state"] == "ready"
    got = d.dump("good", tmp_path / "good", batches=6)
    exp = reference(f"{corpus}/shards/good/shard_*.idx", 0, 1, 6, seq_len=16, batch_size=2)
    for i, e in enumerate(exp):
        assert (got["input_ids"][i] == e["input_ids"]).all(), f"good feed, batch {i}"

    # --check says the same and fails.
    p = subprocess.run([str(FEEDD), "--check", "-c", str(d.conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"{len(SHARD_FAILURES)} failed" in p.stdout + p.stderr


def test_zero_length_documents_are_skipped_and_counted(daemon, corpus, tmp_path):
    shards = f"{corpus}/shards/zero-length-documents/s.idx"
    d = daemon(small("z", shards, eos=7))
    (f,) = d.status()["feeds"]
    assert f["state"] == "ready"
    assert (f["documents"], f["nonempty_documents"]) == (8, 5)
    got = d.dump("z", tmp_path / "z", batches=12)
    exp = reference(shards, 0, 1, 12, seq_len=16, batch_size=2, eos=7)
    for i, e in enumerate(exp):
        assert (got["input_ids"][i] == e["input_ids"]).all(), f"batch {i}"
        assert list(got["cu_seqlens"][i]) == list(e["cu_seqlens"]), f"batch {i}: an empty document left a trace"


def test_an_empty_shard_among_good_ones_is_skipped(daemon, corpus, tmp_path):
    globs = f"{corpus}/shards/good/shard_*.idx, {corpus}/shards/empty-shard/s.idx"
    d = daemon(small("mix", globs))
    (f,) = d.status()["feeds"]
    assert f["state"] == "ready" and f["shards"] == 3 and f["documents"] == 400
    got = d.dump("mix", tmp_path / "m", batches=5)
    # The reference over the same shard list: the empty shard is skipped, not an error.
    import feed_ref
    rs = feed_ref.RankStream(feed_ref.load_shards(feed_ref.expand_globs(
        [f"{corpus}/shards/good/shard_*.idx", f"{corpus}/shards/empty-shard/s.idx"])), 7, True, 2, 1, 0)
    exp = list(rs.batches(16, 2, start_batch=0, count=5))
    for i, e in enumerate(exp):
        assert (got["input_ids"][i] == e["input_ids"]).all(), f"batch {i}"


def test_a_token_out_of_range_stops_that_stream_naming_file_and_byte(daemon, corpus, tmp_path):
    d = daemon(small("t", f"{corpus}/shards/token-out-of-range/s.idx", shuffle="false") + "\n" +
               small("good", f"{corpus}/shards/good/shard_*.idx"))
    p = d.dump("t", tmp_path / "t", batches=20, check=False)
    assert p.returncode == 1
    assert f"{corpus}/shards/token-out-of-range/s.bin: token at byte" in p.stderr, p.stderr
    assert "is outside 0..2147483647" in p.stderr
    got = d.dump("good", tmp_path / "g", batches=3)
    assert got["input_ids"].shape[0] == 3


def test_a_bin_shrunk_while_serving_stops_its_feed_only(daemon, corpus, tmp_path):
    shrinks = f"{corpus}/shards/shrinks"
    d = daemon(small("shrinks", f"{shrinks}/shard_*.idx") + "\n" + small("good", f"{corpus}/shards/good/shard_*.idx"))
    victim = d.client("shrinks", 0, 1, 1_000_000, sleep_ms=10)
    steady = d.client("good", 0, 1, 300, sleep_ms=5)
    wait_attached(d, victim)
    with open(f"{shrinks}/shard_000.bin", "r+b") as f:
        f.truncate(64)
    out, _ = victim.communicate(timeout=30)
    assert victim.returncode == 1
    # Whichever notices first -- a read ending early or the 1 s check of the files -- names the file.
    last = out.strip().splitlines()[-1]
    assert last.startswith("error") and f"{shrinks}/shard_000.bin" in last and "changed while serving" in last, out
    s_out, s_err = steady.communicate(timeout=120)
    assert steady.returncode == 0, s_err
    assert {f["name"]: f["state"] for f in d.status()["feeds"]} == {"shrinks": "failed", "good": "ready"}


# Broken configs: the line and the message (after "<path>:") each must produce.
CONFIG_FAILURES = {
    "unknown-key-daemon": "3: unknown key 'bogus' in [feedd]",
    "unknown-key-feed": "3: unknown key 'seqlen' in [feed.web]",
    "unknown-section": "4: unknown section [fed.web]",
    "bad-integer": "3: seq_len: '12abc' is not an integer",
    "zero-batch-size": "3: batch_size: '0' is not an integer in 1..",
    "negative-integer": "2: threads: '-1' is not an integer",
    "bad-bool": "3: shuffle: 'maybe' is not true or false",
    "bad-token": "3: eos: '1e5' is not 'none'",
    "bad-io-engine": "2: io_engine: 'aio' is not one of",
    "repeated-key": "4: 'seq_len' is given twice in [feed.web]",
    "bad-feed-name": "2: [feed.a/b]: feed names are",
    "missing-shards": " [feed.web]: 'shards' is required",
    "not-ini": "1: syntax error",
    "bad-format": "3: format: 'orc' is not supported",
    "bad-packing": "3: packing: 'firstfit' is not one of concat, bestfit, pad",
    "bad-pack-buffer": "4: pack_buffer: '0' is not an integer in 1..4294967296",
    "pack-buffer-without-bestfit": "4: pack_buffer: applies to packing = bestfit only",
    "bad-pad-id": "4: pad_id: '-1' is not a token id",
    "bad-weight": "2: sources: entry 2",
    "undefined-source": "3: sources: source 'code' has no section [feed.mix.code]",
    "order-key-in-source": "5: 'seq_len' is set for all of [feed.mix]'s sources in [feed.mix]",
    "shards-in-mixture": "3: 'shards' belongs in the sections of [feed.mix]'s sources",
}


def test_every_config_case_has_an_expected_outcome():
    assert set(CONFIG_FAILURES) == set(gen_bad.CONFIGS)


@pytest.mark.parametrize("case", sorted(CONFIG_FAILURES))
def test_a_bad_config_is_refused_naming_file_and_line(corpus, tmp_path, case):
    path = corpus / "conf" / f"{case}.conf"
    want = f"{path}:{CONFIG_FAILURES[case]}"
    p = subprocess.run([str(FEEDD), "--check", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and want in p.stderr, f"--check: {p.returncode} {p.stderr!r}, want {want!r}"
    # Starting with it fails the same way, before listening anywhere.
    sock = tmp_path / "never.sock"
    p = subprocess.run([str(FEEDD), "-c", str(path), "-s", str(sock)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and want in p.stderr, p.stderr
    assert p.returncode > 0, f"feedd died of signal {-p.returncode}"
    assert not sock.exists()


# Tokenizer files, as the daemon's loader reports them.
TOK_FAILURES = {
    "bad-line.tiktoken": "bad-line.tiktoken:101:",
    "bad-rank.tiktoken": "bad-rank.tiktoken:41: bad rank",
    "missing-bytes.tiktoken": "byte 0xc8 has no token; not a byte-level vocabulary",
    "wordpiece.json": "wordpiece.json: model.unk_token: \"[UNK]\" is not in model.vocab",
    "unigram.json": "unigram.json: model.unk_id: unsupported value (missing)",
    "wordlevel.json": "wordlevel.json: model.type: unsupported value \"WordLevel\"",
    "broken.json": "broken.json:2:",
}


@pytest.mark.parametrize("case", sorted(TOK_FAILURES))
def test_a_bad_tokenizer_file_is_refused_naming_file_and_line(corpus, case):
    if not TOK_CHECK.exists():
        pytest.skip(f"{TOK_CHECK} not built")
    p = subprocess.run([str(TOK_CHECK), str(corpus / "tok" / case)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, f"{case}: exit {p.returncode}: {p.stdout} {p.stderr}"
    assert TOK_FAILURES[case] in p.stdout, f"{case}: {p.stdout!r}"


def test_the_good_tokenizer_file_loads(corpus):
    if not TOK_CHECK.exists():
        pytest.skip(f"{TOK_CHECK} not built")
    p = subprocess.run([str(TOK_CHECK), str(corpus / "tok" / "good.tiktoken")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "ok: vocabulary of 50257" in p.stdout, p.stdout


# Text sources. The lead's tests/integration/test_text.py holds the record-level cases (malformed JSON,
# non-object, missing key, non-string text, invalid UTF-8, NUL bytes, truncated .gz/.zst, concatenated
# .zst frames); these are the two that need a corpus of their own.
def text_feed(name, shards, corpus, fmt="jsonl", extra=""):
    return (f"[feed.{name}]\nformat = {fmt}\nshards = {shards}\ntokenizer = {corpus}/tok/good.tiktoken\n"
            f"tokenizer_preset = gpt2\nseq_len = 16\nbatch_size = 2\nshuffle = false\n{extra}")


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_1gib_single_line_document_is_skipped_counted_and_never_read_into_memory(daemon, corpus, tmp_path):
    p = tmp_path / "huge.jsonl"
    good = b"".join(b'{"text": "ab ab ab record %d"}\n' % i for i in range(20))
    with open(p, "wb") as f:
        f.write(good)
        f.seek((1 << 30) - 1, os.SEEK_CUR)  # a sparse 1 GiB run of NUL bytes: one line, no newline in it
        f.write(b"\n" + good)
    d = daemon(f"[feedd]\ncache_dir = {tmp_path}/cache\n" +
               text_feed("huge", p, corpus, extra="max_bad_fraction = 0.5\n"))
    got = d.dump("huge", tmp_path / "out", batches=8)  # shuffle off: the long line is served within these
    assert got["input_ids"].shape[0] == 8
    st = next(f for f in d.status()["feeds"] if f["name"] == "huge")
    assert st["state"] == "ready", st["error"]
    assert st["documents"] == 41 and st["text"]["bad_records"] == 1, (st["documents"], st["text"], d.log_text())
    assert "huge.jsonl:21:" in d.log_text(), d.log_text()
    assert rss_mib(d.proc.pid) < 200, f"feedd peaked at {rss_mib(d.proc.pid):.0f} MiB for a 1 GiB line"


def test_a_token_id_beyond_the_tokenizers_vocabulary_names_file_and_byte(daemon, corpus, tmp_path):
    import numpy as np
    import gen_megatron
    data = tmp_path / "v"
    data.mkdir()
    gen_megatron.write_shard(str(data / "v"), [[np.arange(1, 20)], [np.array([5, 6, 60000, 7])], [np.arange(9)]], "u16")
    d = daemon(f"[feed.v]\nshards = {data}/v.idx\ntokenizer = {corpus}/tok/good.tiktoken\n"
               "tokenizer_preset = gpt2\nseq_len = 8\nbatch_size = 2\nshuffle = false\n")
    p = d.dump("v", tmp_path / "o", batches=4, check=False)
    assert p.returncode == 1 and f"{data}/v.bin" in p.stderr and "60000" in p.stderr, p.stderr
