# SPDX-License-Identifier: MIT
"""feedctl explain on text feeds (docs/sample-order.md, section 17.9).

A real feedd tokenizes JSONL and plain-text shards with a real tokenizer
(cl100k_base). For every line of `feedctl explain` the test re-reads the named
document from its shard file, tokenizes it with the reference encoder (npm
tiktoken), cuts the named token range (plus eos/bos where the line says so) and
compares it with the columns of the row feedctl dump delivered for the same
batches: equal, bit for bit, for every packing mode, with and without virtual
ranks, from a cursor or a merged state, and for a mixture of a JSONL and a
plain-text source. Every delivered position of "concat" batches is explained.

Needs the tokenizer data of scripts/fetch-tok-data.sh (build/tokdata) and
node; skips without (the Parquet cases without scripts/fetch-parquet-data.sh's
DuckDB, which writes the files and reads them back). Runs with Debian's /usr/bin/python3.
"""

import gzip
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BUILD, FEEDCTL, SRC, use_feed_package
from test_text import EOT, RANKS, TOKDATA, paragraphs, record_text, shard_lines, tiktoken_ids

pytestmark = pytest.mark.skipif(
    not RANKS.exists() or not (TOKDATA / "node_modules" / "tiktoken").exists() or not shutil.which("node"),
    reason="tokenizer data (scripts/fetch-tok-data.sh) or node missing")

PQDATA = BUILD / "pqdata"  # scripts/fetch-parquet-data.sh: DuckDB, the Parquet writer and reference reader
L, B = 128, 4
BOS = 100258


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two JSONL shards (one gzip) and twelve plain-text files of the fetched corpus' paragraphs."""
    d = tmp_path_factory.mktemp("explain")
    paras = paragraphs()
    docs = ["", "short one"] + paras[:160]
    lines = [json.dumps({"id": i, "text": t}).encode() for i, t in enumerate(docs)]
    (d / "a.jsonl").write_bytes(b"\n".join(lines[:90]) + b"\n")
    with gzip.open(d / "b.jsonl.gz", "wb") as f:
        f.write(b"\n".join(lines[90:]) + b"\n")
    books = d / "books"
    books.mkdir()
    for i, t in enumerate(paras[200:212]):
        (books / f"p{i:02d}.txt").write_text(t * (1 + i % 3) + "\n")  # some longer than a row
    if (PQDATA / "node_modules" / "@duckdb" / "node-api").exists():
        # Parquet text columns: DuckDB's files of the same kind of documents, small row groups (several per file).
        for name, part in (("q1", paras[220:300]), ("q2", paras[300:360])):
            with open(d / f"{name}.jsonl", "w", encoding="utf-8") as f:
                for i, t in enumerate(part):
                    f.write(json.dumps({"id": i, "text": t, "null": False}) + "\n")
        subprocess.run(["node", str(SRC / "tests" / "parquet" / "mkparquet.mjs"), str(PQDATA), str(d / "pq"),
                        "zstd:dict:v2:16", "--", str(d / "q1.jsonl"), str(d / "q2.jsonl")], check=True, timeout=600)
    return d


_pq_rows = {}


def parquet_rows(path):
    """The text column of a Parquet file as DuckDB (the reference reader) reads it."""
    if path not in _pq_rows:
        r = subprocess.run(["node", str(SRC / "tests" / "parquet" / "dumpparquet.mjs"), str(PQDATA), str(path), "text"],
                           capture_output=True, check=True, timeout=120)
        _pq_rows[path] = [json.loads(ln) for ln in r.stdout.decode("utf-8").splitlines()]
    return _pq_rows[path]


def read_doc(path, index):
    """The text of document `index` of a shard, read again from its file, the Python way."""
    path = Path(path)
    if path.suffix == ".parquet":
        return parquet_rows(path)[index]
    if path.suffix == ".txt":
        assert index == 0
        return path.read_bytes().decode("utf-8", errors="replace")
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    lines = [ln for ln in raw.split(b"\n") if ln.strip()]
    return record_text(lines[index])


def conf(corpus, kind, packing, vranks, bos="none"):
    tok = f"tokenizer = {RANKS}\ntokenizer_preset = cl100k_base\n"
    extra = (f"virtual_ranks = {vranks}\npacking = {packing}\nbos = {bos}\neos = {EOT}\n"
             + ("pack_buffer = 64\n" if packing == "bestfit" else ""))
    head = (f"[feedd]\ncache_dir = {corpus}/cache\n[feed.f]\nseq_len = {L}\nbatch_size = {B}\nseed = 5\n"
            f"shuffle = true\nshuffle_window = 2\n{extra}")
    web = f"format = jsonl\nshards = {shard_lines([corpus / 'a.jsonl', corpus / 'b.jsonl.gz'])}\n{tok}"
    books = f"format = text\nshards = {corpus}/books/p*.txt\n{tok}"
    if kind == "jsonl":
        return head + web
    if kind == "text":
        return head + books
    if kind == "parquet":
        if not (corpus / "pq").exists():
            pytest.skip("the Parquet test data (scripts/fetch-parquet-data.sh) is missing")
        pq = sorted((corpus / "pq").glob("*/q*.parquet"))
        return head + f"format = parquet\nshards = {shard_lines(pq)}\n{tok}"
    return head.replace("[feed.f]\n", "[feed.f]\nsources = web:3, books:1\n") + f"[feed.f.web]\n{web}[feed.f.books]\n{books}"


def check(explain, got, tmp, packing, world, rank, vstreams):
    """Every explained piece equals the reference tokens of its document's range; returns the positions covered."""
    rows = []
    for line in explain.splitlines():
        w = line.split()
        kv = {k: w[w.index(k) + 1] for k in ("vstream", "source", "shard", "doc", "tokens", "of", "file") if k in w}
        rows.append((int(w[1]), int(w[3]), *map(int, w[5].split("-")), kv, "+bos" in w, "+eos" in w))
    assert rows, "explain printed nothing"
    first = min(r[0] for r in rows)
    wanted = sorted({(r[4]["file"], int(r[4]["doc"])) for r in rows})
    ids = dict(zip(wanted, tiktoken_ids([read_doc(p, i) for p, i in wanted], tmp)))
    covered = 0
    for b, row, c0, c1, kv, bos, eos, in rows:
        t0, t1 = map(int, kv["tokens"].split("-"))
        toks = ids[(kv["file"], int(kv["doc"]))]
        assert int(kv["of"]) == len(toks)
        want = ([BOS] if bos else []) + toks[t0:t1].tolist() + ([EOT] if eos else [])
        assert got["input_ids"][b - first][row][c0:c1 + 1].tolist() == want, (kv, b, row)
        if vstreams:
            assert int(kv["vstream"]) % world == rank
        else:
            assert "vstream" not in kv
        covered += c1 - c0 + 1
    n = len(got["input_ids"])
    assert covered <= n * B * L and (packing != "concat" or covered == n * B * L)
    return covered


MODES = ([(k, p) for k in ("jsonl", "mix") for p in ("concat", "pad", "bestfit")] + [("text", "concat")]
         + [("parquet", p) for p in ("concat", "bestfit")])


@pytest.mark.parametrize("kind,packing", MODES, ids=[f"{k}-{p}" for k, p in MODES])
def test_explain_without_virtual_ranks_from_a_cursor(daemon, corpus, tmp_path, kind, packing):
    """--rank r --world R --cursor C: the batches after a cursor, as feedd delivers them."""
    d = daemon(conf(corpus, kind, packing, 0, bos=BOS if packing == "pad" else "none"))
    first = d.dump("f", tmp_path / "a", rank=1, world=2, batches=2)
    cursor = first["cursors"][-1]
    got = d.dump("f", tmp_path / "b", rank=1, world=2, batches=3, cursor=cursor)
    text = d.ctl("explain", "f", "--rank", "1", "--world", "2", "--cursor", cursor, "--batches", "3").stdout
    check(text, got, tmp_path, packing, 2, 1, False)
    # From the start as well (no cursor).
    text = d.ctl("explain", "f", "--rank", "1", "--world", "2", "--batches", "2").stdout
    check(text, first, tmp_path, packing, 2, 1, False)


@pytest.mark.parametrize("kind,packing", MODES, ids=[f"{k}-{p}" for k, p in MODES])
def test_explain_with_virtual_ranks_after_a_resize(daemon, corpus, tmp_path, kind, packing):
    """virtual_ranks = 6: states of 2 ranks merged, explained as rank 2 of 3, against what that rank receives."""
    use_feed_package()
    import feed
    d = daemon(conf(corpus, kind, packing, 6))
    a = d.dump("f", tmp_path / "a", rank=0, world=2, batches=2)
    b = d.dump("f", tmp_path / "b", rank=1, world=2, batches=2)
    state = feed.merge_states([a["cursors"][-1], b["cursors"][-1]])
    got = d.dump("f", tmp_path / "c", rank=2, world=3, batches=3, cursor=state)
    text = d.ctl("explain", "f", "--rank", "2", "--world", "3", "--state", state, "--batches", "3").stdout
    check(text, got, tmp_path, packing, 3, 2, True)
    text = d.ctl("explain", "f", "--rank", "0", "--world", "2", "--batches", "2").stdout
    check(text, a, tmp_path, packing, 2, 0, True)


def test_explain_of_a_text_feed_leaves_the_daemon_serving(daemon, corpus, tmp_path):
    """A client that leaves while its explanation waits for the tokenizer: feedd goes on (no leak, no crash)."""
    d = daemon(conf(corpus, "mix", "concat", 6))
    p = subprocess.Popen([str(FEEDCTL), "--socket", d.socket, "explain", "f", "--rank", "0", "--world", "1",
                          "--batches", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.2)  # sent, and (on a loaded machine, usually) still being tokenized
    p.kill()
    p.wait()
    got = d.dump("f", tmp_path / "a", rank=0, world=1, batches=2)
    check(d.ctl("explain", "f", "--rank", "0", "--world", "1", "--batches", "2").stdout, got, tmp_path, "concat",
          1, 0, True)


def test_explain_reports_a_bad_record_and_feedd_goes_on(daemon, corpus, tmp_path):
    """on_bad_record = fail: the explanation fails naming the file and line, as an attach would; feedd serves on."""
    good = [json.dumps({"text": t}).encode() for t in paragraphs()[:30]]
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join(good[:5] + [b'{"text": "cut off'] + good[5:]) + b"\n")
    tok = f"tokenizer = {RANKS}\ntokenizer_preset = cl100k_base\n"
    d = daemon(f"[feedd]\ncache_dir = {tmp_path}/cache\n[feed.b]\nformat = jsonl\nshards = {p}\n{tok}seq_len = 64\n"
               f"batch_size = 2\nshuffle = false\neos = {EOT}\non_bad_record = fail\nvirtual_ranks = 0\n"
               f"[feed.f]\nformat = jsonl\nshards = {corpus / 'a.jsonl'}\n{tok}seq_len = {L}\nbatch_size = {B}\n"
               f"eos = {EOT}\nvirtual_ranks = 0\n")
    r = d.ctl("explain", "b", "--rank", "0", "--world", "1", "--batches", "20", check=False)
    assert r.returncode != 0 and "bad.jsonl:6:" in r.stderr and "not valid JSON" in r.stderr, r.stderr
    got = d.dump("f", tmp_path / "a", rank=0, world=1, batches=2)
    check(d.ctl("explain", "f", "--batches", "2").stdout, got, tmp_path, "concat", 1, 0, False)
