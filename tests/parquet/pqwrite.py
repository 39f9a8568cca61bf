# SPDX-License-Identifier: MIT
"""A minimal Parquet writer for tests: one optional or required BYTE_ARRAY
column, PLAIN or dictionary values, data page v1 or v2, UNCOMPRESSED or
GZIP. Small on purpose, and able to write files that lie (the `mutate`
hook changes any header field or the dictionary indexes before encoding),
for the malformed-file tests and the fuzz seeds. Real files come from DuckDB
(tests/parquet/mkparquet.mjs); this writer follows parquet.thrift as feedd's
reader does, so it is no independent reference for valid files.
"""

import struct
import zlib

I32, I64, BINARY, LIST, STRUCT, TRUE, FALSE = 5, 6, 8, 9, 12, 1, 2


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zz(v):
    return varint((v << 1) ^ (v >> 63))


def tstruct(fields):
    """fields: [(id, type, value)] in increasing id; value: int, bytes, bool, list (elem_type, items) or nested fields."""
    out, last = bytearray(), 0
    for fid, typ, val in fields:
        if typ in (TRUE, FALSE):
            typ = TRUE if val else FALSE
        out.append(((fid - last) << 4) | typ if 0 < fid - last <= 15 else typ)
        if not 0 < fid - last <= 15:
            out += zz(fid)
        last = fid
        out += tvalue(typ, val)
    out.append(0)
    return bytes(out)


def tvalue(typ, val):
    if typ in (I32, I64):
        return zz(val)
    if typ == BINARY:
        val = val.encode() if isinstance(val, str) else val
        return varint(len(val)) + val
    if typ == STRUCT:
        return tstruct(val)
    if typ == LIST:
        et, items = val
        head = bytes([(len(items) << 4) | et]) if len(items) < 15 else bytes([0xF0 | et]) + varint(len(items))
        return head + b"".join(tvalue(et, x) for x in items)
    if typ in (TRUE, FALSE):
        return b""
    raise ValueError(typ)


def bitpack(values, bw):
    """RLE/bit-packed hybrid, all bit-packed: groups of 8, LSB first."""
    vals = list(values) + [0] * (-len(values) % 8)
    acc, nbits, out = 0, 0, bytearray()
    for v in vals:
        acc |= v << nbits
        nbits += bw
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8
    return varint(((len(vals) // 8) << 1) | 1) + bytes(out)


def plain(values):
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def compress(codec, data):
    if codec == 0:
        return data
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def page(kind, fields, payload_raw, levels, codec, mutate, v2):
    """One page: header + payload. levels are the v2 uncompressed levels (or b'')."""
    body = compress(codec, payload_raw)
    h = {"type": kind, "uncompressed": len(levels) + len(payload_raw), "compressed": len(levels) + len(body), **fields}
    if mutate:
        mutate(h)
    sub_id = {0: 5, 2: 7, 3: 8}[h["type"] if h["type"] in (0, 2, 3) else kind]
    if kind == 2:
        sub = [(1, I32, h["num_values"]), (2, I32, h.get("encoding", 0))]
    elif kind == 0:
        sub = [(1, I32, h["num_values"]), (2, I32, h["encoding"]), (3, I32, 3), (4, I32, 3)]
    else:
        sub = [(1, I32, h["num_values"]), (2, I32, h["num_nulls"]), (3, I32, h["num_rows"]), (4, I32, h["encoding"]),
               (5, I32, h["def_len"]), (6, I32, h.get("rep_len", 0)), (7, TRUE, codec != 0)]
    fields = [(1, I32, h["type"]), (2, I32, h["uncompressed"]), (3, I32, h["compressed"]), (sub_id, STRUCT, sub)]
    if "pad" in h:  # an unknown field a reader must skip (as it would statistics it does not read)
        fields.append((20, BINARY, h["pad"]))
    hdr = tstruct(fields)
    return hdr + levels + body


def write(rows, codec=0, use_dict=False, v2=False, rg_rows=1000, page_rows=300, optional=True, mutate=None,
          column="text", meta_codec=None):
    """The file's bytes. rows: str/bytes or None (null). mutate(what, obj) may change: ("dict"|"data", header
    dict), ("indices", list) before they are encoded, ("footer", bytes) -> bytes."""
    rows = [r.encode() if isinstance(r, str) else r for r in rows]
    out = bytearray(b"PAR1")
    groups = []
    for g0 in range(0, max(len(rows), 1), rg_rows):
        grp = rows[g0:g0 + rg_rows]
        start = len(out)
        dict_off = None
        dictionary = {}
        if use_dict:
            for r in grp:
                if r is not None and r not in dictionary:
                    dictionary[r] = len(dictionary)
            dict_off = len(out)
            out += page(2, {"num_values": len(dictionary), "encoding": 0}, plain(list(dictionary)), b"", codec,
                        mutate and (lambda h: mutate("dict", h)), v2)
        data_off = len(out)
        for p0 in range(0, max(len(grp), 1), page_rows):
            prow = grp[p0:p0 + page_rows]
            defined = [r for r in prow if r is not None]
            levels = bitpack([int(r is not None) for r in prow], 1) if optional else b""
            if use_dict:
                idx = [dictionary[r] for r in defined]
                if mutate:
                    mutate("indices", idx)
                bw = max(1, (max(idx) if idx else 0).bit_length())
                values, enc = bytes([bw]) + bitpack(idx, bw), 8 if v2 else 2
            else:
                values, enc = plain(defined), 0
            hook = mutate and (lambda h: mutate("data", h))
            if v2:
                f = {"num_values": len(prow), "num_nulls": len(prow) - len(defined), "num_rows": len(prow),
                     "encoding": enc, "def_len": len(levels)}
                out += page(3, f, values, levels, codec, hook, True)
            else:
                raw = (struct.pack("<I", len(levels)) + levels if optional else b"") + values
                out += page(0, {"num_values": len(prow), "encoding": enc}, raw, b"", codec, hook, False)
        size = len(out) - start
        meta = [(1, I32, 6), (2, LIST, (I32, [0, 3] + ([enc] if use_dict else []))), (3, LIST, (BINARY, [column])),
                (4, I32, (codec and 2) if meta_codec is None else meta_codec), (5, I64, len(grp)), (6, I64, size), (7, I64, size), (9, I64, data_off)]
        if dict_off is not None:
            meta.append((11, I64, dict_off))
        groups.append([(1, LIST, (STRUCT, [[(2, I64, start), (3, STRUCT, meta)]])), (2, I64, size),
                       (3, I64, len(grp))])
    schema = [[(4, BINARY, "schema"), (5, I32, 1)],
              [(1, I32, 6), (3, I32, 1 if optional else 0), (4, BINARY, column), (6, I32, 0)]]
    footer = tstruct([(1, I32, 1), (2, LIST, (STRUCT, schema)), (3, I64, len(rows)), (4, LIST, (STRUCT, groups)),
                      (6, BINARY, "feedd tests/parquet/pqwrite.py")])
    if mutate:
        footer = mutate("footer", footer) or footer
    out += footer + struct.pack("<I", len(footer)) + b"PAR1"
    return bytes(out)
