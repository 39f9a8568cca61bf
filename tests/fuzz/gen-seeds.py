#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of one fuzz target into a directory.

Usage: gen-seeds.py TARGET OUTDIR   (TARGET: wire, idx, rankfile, hf, ring, jsonl, parquet, sums, cursor)

Seeds are valid inputs in each target's input format (see the target's
header comment), plus a few near-misses, so the fuzzer starts from the
accepting paths. They are generated at build time rather than committed;
committed reproducers of findings live in tests/fuzz/corpus/TARGET/.
"""

import base64
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "ref"))
from feed_ref import cursor_check as check_of  # noqa: E402  (section 7.1, the reference's)

MAGIC = 0x57444546
CURSOR_MAX = 512


def header(typ, n, version=1):
    return struct.pack("<IHHII", MAGIC, version, typ, n, 0)


def fixed(s, size):
    b = s.encode()
    assert len(b) < size
    return b + bytes(size - len(b))


def hello(name="trainer"):
    return struct.pack("<HHI", 1, 1, 4242) + fixed(name, 32)


def hello_reply():
    return struct.pack("<HHII", 1, 0, 99, 0) + fixed("0.1.0", 32)


def attach(feed="web", rank=1, world=4, cursor=""):
    return struct.pack("<IIII", rank, world, 1 if cursor else 0, 0) + fixed(feed, 64) + fixed(cursor, CURSOR_MAX)


def attach_reply(ring_size=20480, slots=4, b=2, l=8):
    return struct.pack("<QQQQIIII", ring_size, 8192, 0x1234, 0, slots, b, l, 4)


def error(msg="feed web: /data/x.bin: changed while serving"):
    return struct.pack("<iI", -116, 0) + fixed(msg, 512)


def status():
    return struct.pack("<II", 0, 0)


def wire(out):
    cursor = "fc1-1-2-3-4-5-6-7-8-9"
    payloads = [(0, hello()), (1, hello_reply()), (2, attach()), (2, attach(cursor=cursor)), (3, attach_reply()),
                (4, error()), (5, status()), (6, b"")]
    for i, (sel, p) in enumerate(payloads):
        (out / f"single-{i}").write_bytes(bytes([sel]) + p)
    # Streams: what a client sends on a connection, and near-misses.
    stream = header(1, 40) + hello() + header(3, len(attach(cursor=cursor))) + attach(cursor=cursor) + \
        header(6, 8) + status() + header(8, 0)
    (out / "stream-client").write_bytes(b"\xff" + stream)
    (out / "stream-daemon").write_bytes(b"\xff" + header(2, 44) + hello_reply() + header(4, 48) + attach_reply() +
                                        header(5, 520) + error())
    (out / "stream-oversize").write_bytes(b"\xff" + header(3, 1 << 20) + attach())
    (out / "stream-version").write_bytes(b"\xff" + header(1, 40, version=7) + hello())


def idx(out):
    import numpy as np
    import gen_megatron
    rng = np.random.default_rng(1)
    cases = {
        "u16-mixed": ([[rng.integers(0, 60000, 7)], [], [np.array([], np.int64)], [rng.integers(0, 9, 3),
                                                                                  rng.integers(0, 9, 4)]], "u16"),
        "i32": ([[rng.integers(0, 1 << 30, n)] for n in (1, 5, 0, 9)], "i32"),
        "u8": ([[rng.integers(0, 255, 4)], [rng.integers(0, 255, 2)]], "u8"),
        "i64": ([[rng.integers(0, 1 << 31, 3)]], "i64"),
        "i16": ([[rng.integers(0, 30000, 3)], [rng.integers(0, 5, 1)]], "i16"),
        "empty": ([], "u16"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (docs, dt) in cases.items():
            prefix = os.path.join(tmp, name)
            gen_megatron.write_shard(prefix, docs, dt)
            bin_size = os.path.getsize(prefix + ".bin")
            raw = Path(prefix + ".idx").read_bytes()
            (out / name).write_bytes(struct.pack("<Q", bin_size) + raw)
            # The same index against a .bin one token short: refused.
            (out / (name + "-short-bin")).write_bytes(struct.pack("<Q", max(bin_size - 1, 0)) + raw)
        # With Megatron's optional mode bytes (one per sequence).
        prefix = os.path.join(tmp, "modes")
        gen_megatron.write_shard(prefix, [[np.arange(3)], [np.arange(2)]], "u16")
        raw = Path(prefix + ".idx").read_bytes() + bytes(2)
        (out / "modes").write_bytes(struct.pack("<Q", os.path.getsize(prefix + ".bin")) + raw)


def rank_lines(merges=("ab", "cd", "abcd", " a", "he", "ll", "hell", "hello", "Th", "The", " t", "in")):
    lines = [base64.b64encode(bytes([b])).decode() + f" {b}" for b in range(256)]
    lines += [base64.b64encode(m.encode()).decode() + f" {256 + i}" for i, m in enumerate(merges)]
    return "\n".join(lines) + "\n"


def rankfile(out):
    text = rank_lines()
    for sel in range(6):
        (out / f"preset-{sel}").write_bytes(bytes([sel]) + text.encode())
    (out / "bad-line").write_bytes(b"\x00" + (text + "eHl6 12x\n").encode())
    (out / "no-newline").write_bytes(b"\x03" + text.rstrip("\n").encode())


def byte_level_char(b):
    """GPT-2's bytes_to_unicode."""
    if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff:
        return chr(b)
    n = sum(1 for c in range(b) if not (0x21 <= c <= 0x7e or 0xa1 <= c <= 0xac or 0xae <= c <= 0xff))
    return chr(0x100 + n)


def hf_doc(pre, normalizer=None, added=(), extra=None):
    vocab = {byte_level_char(b): b for b in range(256)}
    vocab.update({"ab": 256, "\u0120a": 257, "abc": 258, "he": 259, "ll": 260, "hell": 261})
    model = {"type": "BPE", "vocab": vocab, "merges": ["a b", ["\u0120", "a"], "ab c", "h e", "l l", "he ll"]}
    model.update(extra or {})
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added),
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None, "decoder": None, "model": model}


def hf(out):
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    seq = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\S+|\\s+"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    eos = {"id": 300, "content": "<eos>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    docs = {
        "bytelevel": hf_doc(bl, added=[eos]),
        "sequence-nfc": hf_doc(seq, normalizer={"type": "NFC"}),
        "ignore-merges": hf_doc(bl, extra={"ignore_merges": True}),
        "wordpiece": {"model": {"type": "WordPiece", "vocab": {}}},
        "nfkc": hf_doc(bl, normalizer={"type": "NFKC"}),
        # Unigram (T5/XLM-R style) and WordPiece (BERT style), small vocabularies.
        "unigram": {"version": "1.0", "added_tokens": [dict(eos, id=0, content="<pad>")],
                    "normalizer": {"type": "Sequence", "normalizers": [{"type": "StripAccents"}, {"type": "Lowercase"}]},
                    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                      "split": True},
                    "model": {"type": "Unigram", "unk_id": 1, "byte_fallback": True, "vocab": [
                        ["<pad>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0], ["\u2581h", -3.0], ["ell", -2.5],
                        ["o", -1.5], ["\u2581the", -1.0], ["<0x21>", -5.0], ["l", -4.0], ["e", -4.0]]}},
        "wordpiece-bert": {"version": "1.0", "added_tokens": [dict(eos, id=4, content="[CLS]")],
                           "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                          "strip_accents": None, "lowercase": True},
                           "pre_tokenizer": {"type": "BertPreTokenizer"},
                           "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                                     "max_input_chars_per_word": 100, "vocab": {
                                         "[UNK]": 0, "hello": 1, "he": 2, "##llo": 3, "[CLS]": 4, ",": 5, "!": 6,
                                         "the": 7, "##s": 8}}},
    }
    for name, d in docs.items():
        (out / f"{name}.json").write_text(json.dumps(d, ensure_ascii=(name != "sequence-nfc")))
    (out / "broken.json").write_text('{"model": {\n  "type": "BPE",,\n}')


def ring(out):
    page, slot_hdr = 4096, 1024

    def up(x, a):
        return (x + a - 1) // a * a

    def image(b, l, slots, published, state=0, corrupt=None):
        n = b * l
        arr, cu = up(n * 4, 64), up((n + 1) * 4, 64)
        size = up(slot_hdr + 3 * arr + cu, page)
        offs = [slot_hdr, slot_hdr + arr, slot_hdr + 2 * arr, slot_hdr + 3 * arr]
        hdr = struct.pack("<QIIIIIIIIIIIIII", 0x474e495244454546, 1, page, slots, size, b, l, *offs, n + 1, 0, 1, 0)
        hdr = hdr.ljust(64, b"\0") + struct.pack("<QIiIIQQ", published, state, 0, 0, 0, 1, 0)
        ring = bytearray(hdr.ljust(page, b"\0") + bytes(size * slots))
        for seq in range(published):
            base = page + (seq % slots) * size
            cursor = f"fc1-0-0-{seq}-0-0-0-0-0-0".encode()
            sh = struct.pack("<QQQIIIIIIQ", seq, seq, 0, 0, 1, b, l, 3, 2, 0) + bytes(24)
            ring[base:base + len(sh)] = sh
            ring[base + 80:base + 80 + len(cursor)] = cursor  # slot header: cursor at byte 80
            for k, off in enumerate(offs[:3]):
                ring[base + off:base + off + 4 * n] = struct.pack(f"<{n}i", *[(k + 1) * i for i in range(n)])
            ring[base + offs[3]:base + offs[3] + 12] = struct.pack("<3i", 0, n // 2, n)
        if corrupt:
            corrupt(ring, offs, size)
        return struct.pack("<QQQQIIII", len(ring), 8192, 7, 0, slots, b, l, 4) + bytes(ring)

    (out / "two-published").write_bytes(image(2, 8, 4, 2))
    (out / "full").write_bytes(image(2, 8, 4, 4))
    (out / "wrapped").write_bytes(image(1, 16, 2, 2))
    (out / "failed").write_bytes(image(2, 8, 4, 0, state=1))
    (out / "stopping").write_bytes(image(2, 8, 4, 1, state=2))

    def bad_cu(ring, offs, size):
        ring[page + 40:page + 44] = struct.pack("<I", 10 ** 6)  # slot 0: n_cu_seqlens
    (out / "bad-cu").write_bytes(image(2, 8, 4, 1, corrupt=bad_cu))


def jsonl(out):
    lines = [b'{"text": "hello world"}', b'{"id": 3, "text": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00 \\u0000 nul"}',
             b'{"text": "bad \xff\xfe utf-8 \xc3 cut"}', b'["text", "array"]', b'{"body": "no key"}',
             b'{"text": 42}', b'{"text": "cut off', b'  {"text" : "spaced"}  ', b'{"content": "other key"}']
    for i, line in enumerate(lines):
        (out / f"line-{i}").write_bytes(b"\x00" + line)
    (out / "key-content").write_bytes(b"\x01" + lines[-1])


def parquet(out):
    """Files from tests/parquet/pqwrite.py in each of its shapes (tests/fuzz/corpus/parquet/ holds DuckDB's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parquet"))
    import pqwrite
    rows = ["hello", None, "w\u00f6rld", "", "hello", "x" * 40] * 6
    for codec in (0, 2):
        for d in (False, True):
            for v2 in (False, True):
                for opt in (False, True):
                    rr = rows if opt else [r or "" for r in rows]
                    name = f"pq-{codec}-{int(d)}-{int(v2)}-{int(opt)}"
                    (out / name).write_bytes(pqwrite.write(rr, codec=codec, use_dict=d, v2=v2, optional=opt,
                                                           rg_rows=20, page_rows=7))
    (out / "empty").write_bytes(pqwrite.write([]))


def sums(out):
    """Cache files with a trailer (0) and sidecars (1), written by daemon/io/sums.c's layout."""
    import struct
    for name in ("trailer", "sidecar"):
        for size, block in ((0, 512), (1, 512), (1000, 512), (4096, 4096), (5000, 1024)):
            data = bytes((i * 7) & 0xFF for i in range(size))
            n = (size + block - 1) // block
            sums = b"".join(struct.pack("<Q", i) for i in range(n))  # wrong sums: the parser's refusals
            foot = b"FDSUMS01" + struct.pack("<IIQQQQQQ", 1, block, size, n, 0, 0, 0, 0)
            body = (data if name == "trailer" else b"") + sums + foot
            (out / f"{name}-{size}-{block}").write_bytes(bytes([0 if name == "trailer" else 1]) + body)
    # Whole files the C code wrote are committed under corpus/sums/ (accepted inputs).


def cursor(out):
    """fc1, fc2 and fv1 texts as feedd writes them, with and without <data> and k_w (issue #22)."""
    fp, data = "0123456789abcdef", "00000000000000ff"
    bodies = {
        "fc1": f"fc1-{fp}-8-3-3e8-2-5-4d-c",
        "fc1-data": f"fc1-{fp}-8-3-3e8-2-5-4d-c-{data}",
        "fc1-kw": f"fc1-{fp}-8-3-3e8-2-5-4d-c-{data}-1f",
        "fc2": f"fc2-{fp}-8-3-3e8-9-0-0-2-1-2-3-4-5-6",
        "fc2-data": f"fc2-{fp}-8-3-3e8-9-0-0-2-1-2-3-4-5-6-{data}",
        "fc2-kw": f"fc2-{fp}-8-3-3e8-9-0-0-2-1-2-3-4-5-6-{data}-1f-20",
        "fv1": f"fv1-{fp}-10-3-1-2a-2-1-0-5-0-2-4-0-4-0-7-0-1-9-3",
        "fv1-kw": f"fv1-{fp}-10-3-1-2a-2-1-0-5-0-2-4-0-4-0-7-0-1-9-3-64-c8",
        "fv1-mix-kw": f"fv1-{fp}-10-0-0-2a-1-4-2-5-1-0-0-1-2-3-4-5-6-a-b",
        "fv1-global-kw": f"fv1-{fp}-10-0-0-2a-2-1-0-5-0-2-4-0-2-0-3-0-1-9-3-64-c8",
    }
    for name, body in bodies.items():
        (out / name).write_text(f"{body}-{check_of(body):08x}")
    (out / "fc2-kw-bad-check").write_text(bodies["fc2-kw"] + "-00000000")


def main():
    target, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        f.unlink()
    {"wire": wire, "idx": idx, "rankfile": rankfile, "hf": hf, "ring": ring, "jsonl": jsonl,
     "parquet": parquet, "sums": sums, "cursor": cursor}[target](out)


if __name__ == "__main__":
    main()
