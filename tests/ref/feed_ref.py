#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Reference implementation of feedd's sample-order contract.

Runs with Debian's /usr/bin/python3 and python3-numpy; nothing else.

Written from the contract text alone, never from the daemon's C code: tests
compare the daemon's batches against this module, so the two must be
independent to catch each other's mistakes. Readability beats speed here, but
it is fast enough for tests (whole documents are sliced from np.memmap and
glued with one np.concatenate per batch; there is no per-token Python loop).

API
  load_shards(idx_paths) -> [Shard]           .idx/.bin pairs, in the order given
  expand_globs(globs) -> [idx path]           config globs -> ordered shard list
  epoch_order(doc_counts, seed, shuffle, window, epoch, list_max=0) -> [(shard, doc)]
  permute_at(n, key, idx) -> int64 array      section 3.1, the bijection of a large window
  RankStream(shards, seed, shuffle, window, world, rank, bos=None, eos=None, list_max=0)
      .batches(seq_len, batch_size, start_batch=0, count=None) -> iter of dict
      .epoch_docs(epoch) -> [(shard, doc)] this rank's documents, empty ones too
      .cursor() -> StreamCursor                (used by bench/dataloader_baseline.py)
  effective_vranks(virtual_ranks, docs_per_source) -> V'      section 17.1
  virtual_streams(V', world, rank) -> [v]                     section 17.2
  virtual_batches(rows_of, streams, batch_size, seq_len) -> iter of dict (with "rows": [(v, row)])
  virtual_epoch_info(row_epochs, batch_size, start, start_batch) -> (epoch, first_batch, batches)  section 17.10
  make_batch(tokens, starts, batch_size, seq_len) -> dict of int32 arrays

A batch dict holds input_ids, labels, position_ids (int32 [B, L]), cu_seqlens
(int32, 1-D), epoch (the epoch of the batch's first position) and batch (b).

Contract decisions not spelled out in the spec text, and how this file reads
them:
  * A rank whose documents in an epoch are all empty simply skips that epoch.
    Without shuffle every epoch is the same, so such a rank would never get a
    token; reading from it raises RuntimeError instead of looping forever.
  * Attach (the RankStream constructor) raises ValueError when the feed has
    fewer documents with at least one token than the world size.
"""

import glob
import os

import numpy as np

MASK64 = 0xFFFFFFFFFFFFFFFF
GOLDEN = 0x9E3779B97F4A7C15
IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_HEADER = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, S, D

# Megatron dtype codes. 6 (f64) and 7 (f32) are valid in the format but the
# contract says shard tokens are integers, so they are rejected at load time.
IDX_DTYPES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}
IDX_FLOAT_CODES = {6, 7}

# With shuffle on, a rank may draw only empty documents in some epochs. Give up
# after this many in a row: the shard set is then effectively unusable.
MAX_EMPTY_EPOCHS = 1000


# --------------------------------------------------------------------------
# 64-bit arithmetic, exactly as the contract states it (Python ints, masked).

def mix(x):
    """The contract's mix(): the splitmix64 finaliser on a wrapping u64."""
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def cursor_check(body):
    """A cursor's or state's <check> (section 7.1): the low 32 bits of mix(FNV-1a 64 of the text before it)."""
    h = 0xCBF29CE484222325
    for b in body.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return mix(h) & 0xFFFFFFFF


class Rng:
    """RNG(key): counter c from 0; next() = mix(key + (c += 1) * GOLDEN)."""

    def __init__(self, key):
        self.key = key & MASK64
        self.counter = 0

    def next(self):
        self.counter = (self.counter + 1) & MASK64
        return mix((self.key + ((self.counter * GOLDEN) & MASK64)) & MASK64)

    def below(self, n):
        return self.next() % n


def shuffle_list(a, rng):
    """Fisher-Yates from the top, as the contract's shuffle(a, rng); in place."""
    for i in range(len(a) - 1, 0, -1):
        j = rng.below(i + 1)
        a[i], a[j] = a[j], a[i]


def mix_array(x):
    """mix() on every element of a uint64 array (numpy's uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


PERM_ROUNDS = 8


def permute_at(n, key, idx):
    """Section 3.1, the bijection of [0, n) keyed by `key`: perm(i) for each i in idx.

    A Feistel network of PERM_ROUNDS rounds over [0, 4^h), h the least with
    4^h >= n, halves of h bits; round keys are RNG(key)'s first draws; a
    value >= n goes through the network again (cycle walking).
    """
    half = (((n - 1).bit_length() if n > 1 else 0) + 1) // 2
    mask, sh = np.uint64((1 << half) - 1), np.uint64(half)
    rng = Rng(key)
    keys = [np.uint64(rng.next()) for _ in range(PERM_ROUNDS)]
    x = np.array(idx, dtype=np.uint64)
    todo = np.arange(len(x))
    with np.errstate(over="ignore"):
        while len(todo):
            y = x[todo]
            left, right = y >> sh, y & mask
            for k in keys:
                left, right = right, left ^ (mix_array(right ^ k) & mask)
            y = (left << sh) | right
            x[todo] = y
            todo = todo[y >= np.uint64(n)]
    return x.astype(np.int64)


def epoch_key(seed, epoch):
    return mix((seed & MASK64) ^ mix((epoch + 1) & MASK64))


def window_key(k, w):
    return mix(k ^ mix((w + 1) & MASK64))


# --------------------------------------------------------------------------
# Shards

class Shard:
    """One Megatron indexed dataset (.idx parsed eagerly, .bin memory-mapped).

    docs:      number of documents
    doc_lens:  int64[docs], tokens per document
    doc_tokens(d) -> 1-D array of the shard's dtype (a view of the memmap when
               the document is one sequence)
    """

    def __init__(self, idx_path):
        if not idx_path.endswith(".idx"):
            raise ValueError(f"{idx_path}: expected a path ending in .idx")
        self.idx_path = idx_path
        self.bin_path = idx_path[:-4] + ".bin"
        raw = open(idx_path, "rb").read()
        if len(raw) < IDX_HEADER or raw[:9] != IDX_MAGIC:
            raise ValueError(f"{idx_path}: not a Megatron .idx (bad magic or short header)")
        version = int.from_bytes(raw[9:17], "little")
        code = raw[17]
        nseq = int.from_bytes(raw[18:26], "little")
        ndoc_idx = int.from_bytes(raw[26:34], "little")
        if version != 1:
            raise ValueError(f"{idx_path}: .idx version {version}, only 1 is supported")
        if code in IDX_FLOAT_CODES:
            raise ValueError(f"{idx_path}: dtype code {code} is floating point, not tokens")
        if code not in IDX_DTYPES:
            raise ValueError(f"{idx_path}: unknown dtype code {code}")
        self.dtype = np.dtype(IDX_DTYPES[code])
        want = IDX_HEADER + nseq * 12 + ndoc_idx * 8
        if len(raw) != want:
            raise ValueError(f"{idx_path}: size {len(raw)}, header says {want}")
        off = IDX_HEADER
        self.seq_lens = np.frombuffer(raw, "<i4", nseq, off).astype(np.int64)
        off += 4 * nseq
        self.pointers = np.frombuffer(raw, "<i8", nseq, off).astype(np.int64)
        off += 8 * nseq
        self.doc_idx = np.frombuffer(raw, "<i8", ndoc_idx, off).astype(np.int64)
        self._validate(nseq)

        self.docs = len(self.doc_idx) - 1
        seq_cum = np.zeros(nseq + 1, np.int64)
        np.cumsum(self.seq_lens, out=seq_cum[1:])
        self.doc_lens = seq_cum[self.doc_idx[1:]] - seq_cum[self.doc_idx[:-1]]
        size = os.path.getsize(self.bin_path)
        # np.memmap refuses empty files; an all-empty shard is still valid.
        self.tokens = (np.memmap(self.bin_path, self.dtype, "r") if size
                       else np.zeros(0, self.dtype))

    def _validate(self, nseq):
        p, isz = self.idx_path, self.dtype.itemsize
        if len(self.doc_idx) < 1 or self.doc_idx[0] != 0 or self.doc_idx[-1] != nseq:
            raise ValueError(f"{p}: doc_idx must run from 0 to the sequence count {nseq}")
        if np.any(np.diff(self.doc_idx) < 0):
            raise ValueError(f"{p}: doc_idx is not ascending")
        if np.any(self.seq_lens < 0):
            raise ValueError(f"{p}: negative sequence length")
        if np.any(self.pointers % isz) or np.any(self.pointers < 0):
            raise ValueError(f"{p}: pointer not a multiple of the token size {isz}")
        binsize = os.path.getsize(self.bin_path)
        if nseq and np.max(self.pointers + self.seq_lens * isz) > binsize:
            raise ValueError(f"{p}: a sequence ends past the end of {self.bin_path} ({binsize} bytes)")

    def doc_tokens(self, d):
        """Tokens of document d in the shard's dtype (may be a memmap view)."""
        a, b = self.doc_idx[d], self.doc_idx[d + 1]
        isz = self.dtype.itemsize
        parts = [self.tokens[self.pointers[s] // isz:self.pointers[s] // isz + self.seq_lens[s]]
                 for s in range(a, b)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)


def load_shards(idx_paths):
    """Open each .idx (and its .bin) in the order given; returns [Shard]."""
    return [Shard(os.fspath(p)) for p in idx_paths]


def expand_globs(globs):
    """The feed's shard list: globs in config order, each glob's matches sorted
    by path bytes. A glob may name the .idx files or the shard prefixes (then
    ".idx" is appended). Sorting is of the .idx paths as matched."""
    out = []
    for g in globs:
        pattern = g if g.endswith(".idx") else g + ".idx"
        matches = [m for m in glob.glob(pattern) if m.endswith(".idx")]
        out += sorted(matches, key=os.fsencode)
    return out


# --------------------------------------------------------------------------
# Epoch order

def _epoch_global_order(doc_counts, seed, shuffle, window, epoch, list_max=0):
    """The epoch's order as global document ids (shard base + doc), int64.

    list_max (shuffle_list_max, M): a shuffled window of more than M
    documents is permuted by the bijection (section 3.1); 0: never.
    """
    if window < 1:
        raise ValueError(f"shuffle window {window} must be >= 1")
    base = np.concatenate(([0], np.cumsum(doc_counts, dtype=np.int64)))
    key = epoch_key(seed, epoch)
    perm = list(range(len(doc_counts)))
    if shuffle:
        shuffle_list(perm, Rng(key))
    out = []
    for w in range(0, (len(perm) + window - 1) // window):
        ids = [np.arange(base[s], base[s + 1]) for s in perm[w * window:(w + 1) * window]]
        ids = np.concatenate(ids)
        if shuffle and list_max and len(ids) > list_max:
            ids = ids[permute_at(len(ids), window_key(key, w), np.arange(len(ids)))]
        elif shuffle:
            ids = ids.tolist()
            shuffle_list(ids, Rng(window_key(key, w)))
        out.append(np.array(ids, np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64), base


def epoch_order(doc_counts, seed, shuffle, window, epoch, list_max=0):
    """Epoch `epoch`'s document order over all ranks: list of (shard, doc)."""
    ids, base = _epoch_global_order(list(doc_counts), seed, shuffle, window, epoch, list_max)
    shard = np.searchsorted(base, ids, side="right") - 1
    return list(zip(shard.tolist(), (ids - base[shard]).tolist()))


# --------------------------------------------------------------------------
# Batches

def make_batch(tokens, starts, batch_size, seq_len):
    """Build one batch from B*L+1 stream positions.

    tokens: int32[B*L+1], stream positions from the batch's first onward (the
    extra one feeds the last label). starts: bool[B*L+1], True where a position
    is the first position of a document. Returns new int32 arrays.
    """
    n = batch_size * seq_len
    assert len(tokens) == n + 1 and len(starts) == n + 1
    idx = np.arange(n)
    reset = starts[:n] | (idx % seq_len == 0)
    last_reset = np.maximum.accumulate(np.where(reset, idx, 0))
    labels = np.array(tokens[1:], np.int32)
    labels[starts[1:]] = -100
    return {
        "input_ids": np.array(tokens[:n], np.int32).reshape(batch_size, seq_len),
        "labels": labels.reshape(batch_size, seq_len),
        "position_ids": (idx - last_reset).astype(np.int32).reshape(batch_size, seq_len),
        "cu_seqlens": np.append(np.flatnonzero(reset), n).astype(np.int32),
    }


class _EpochPlan:
    """One rank's non-empty documents of one epoch, with their stream lengths."""

    def __init__(self, ids, contrib):
        keep = contrib > 0
        self.ids = ids[keep]                      # global doc ids
        self.contrib = contrib[keep]              # bos + tokens + eos
        self.cum = np.zeros(len(self.ids) + 1, np.int64)  # exclusive prefix sums
        np.cumsum(self.contrib, out=self.cum[1:])
        self.total = int(self.cum[-1])


class RankStream:
    """Rank `rank`'s token stream over epochs 0, 1, 2, ... and its batches."""

    def __init__(self, shards, seed, shuffle, window, world, rank, bos=None, eos=None, virtual=False,
                 list_max=0):
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world size {world}")
        if window < 1:
            raise ValueError(f"shuffle window {window} must be >= 1")
        if not 0 <= seed <= MASK64:
            raise ValueError(f"seed {seed} is not a u64")
        self.shards = list(shards)
        self.seed, self.shuffle, self.window = seed, bool(shuffle), window
        self.list_max = list_max
        self.world, self.rank, self.bos, self.eos = world, rank, bos, eos
        self.doc_counts = [s.docs for s in self.shards]
        self.base = np.concatenate(([0], np.cumsum(self.doc_counts, dtype=np.int64)))
        self.doc_lens = (np.concatenate([s.doc_lens for s in self.shards])
                         if self.shards else np.zeros(0, np.int64))
        nonempty = int(np.count_nonzero(self.doc_lens))
        if nonempty < world and not virtual:  # a virtual stream without tokens is dead instead (section 17.4)
            raise ValueError(f"feed has {nonempty} non-empty documents, "
                             f"fewer than the world size {world}")
        extra = (bos is not None) + (eos is not None)
        # A zero-token document contributes nothing, not even bos/eos.
        self.contrib_lens = np.where(self.doc_lens > 0, self.doc_lens + extra, 0)
        self._plans = {}
        self._bos = np.array([bos if bos is not None else 0], np.int32)
        self._eos = np.array([eos if eos is not None else 0], np.int32)

    def _locate(self, gid):
        s = int(np.searchsorted(self.base, gid, side="right")) - 1
        return s, int(gid - self.base[s])

    def epoch_docs(self, epoch):
        """This rank's documents of `epoch` (empty ones included): [(shard, doc)]."""
        ids, _ = _epoch_global_order(self.doc_counts, self.seed, self.shuffle,
                                     self.window, epoch, self.list_max)
        return [self._locate(g) for g in ids[self.rank::self.world].tolist()]

    def plan(self, epoch):
        """_EpochPlan of `epoch`, cached (a few recent epochs only)."""
        p = self._plans.get(epoch)
        if p is None:
            ids, _ = _epoch_global_order(self.doc_counts, self.seed, self.shuffle,
                                         self.window, epoch, self.list_max)
            ids = ids[self.rank::self.world]
            p = _EpochPlan(ids, self.contrib_lens[ids])
            if len(self._plans) >= 4:
                self._plans.pop(min(self._plans))
            self._plans[epoch] = p
        return p

    def nonempty_epoch(self, epoch):
        """The first epoch >= `epoch` in which this rank has a token."""
        for e in range(epoch, epoch + MAX_EMPTY_EPOCHS):
            if self.plan(e).total:
                return e
            if not self.shuffle:
                break  # every epoch is the same as this one
        raise RuntimeError(f"rank {self.rank} of {self.world} gets only empty documents "
                           f"from epoch {epoch} on")

    def doc_stream(self, gid):
        """Pieces making up document gid's stream contribution: [bos] tokens [eos]."""
        s, d = self._locate(gid)
        pieces = [self.shards[s].doc_tokens(d)]
        if self.bos is not None:
            pieces.insert(0, self._bos)
        if self.eos is not None:
            pieces.append(self._eos)
        return pieces

    def cursor(self):
        return StreamCursor(self)

    def batches(self, seq_len, batch_size, start_batch=0, count=None):
        """Batches start_batch, start_batch+1, ... (count of them, or forever)."""
        if seq_len < 1 or batch_size < 1 or start_batch < 0:
            raise ValueError("seq_len and batch_size must be >= 1, start_batch >= 0")
        n = seq_len * batch_size
        cur = self.cursor()
        cur.advance(start_batch * n)  # walks document lengths only
        b = start_batch
        while count is None or b < start_batch + count:
            epoch = cur.epoch
            tokens, starts = cur.read(n + 1)
            batch = make_batch(tokens, starts, batch_size, seq_len)
            batch["epoch"] = epoch
            batch["batch"] = b
            yield batch
            cur.advance(n)
            b += 1


class StreamCursor:
    """A position in a rank's stream: (epoch, i-th non-empty doc, offset in it).

    Always points at a real stream position (offset < that document's length),
    so `epoch` is the epoch of the position the cursor is at.
    """

    def __init__(self, stream):
        self.stream = stream
        self.epoch = stream.nonempty_epoch(0)
        self.doc = 0
        self.offset = 0

    def advance(self, n):
        """Move n positions forward, reading only document lengths."""
        st = self.stream
        while n > 0:
            p = st.plan(self.epoch)
            here = int(p.cum[self.doc]) + self.offset  # position within the epoch
            if here + n < p.total:
                target = here + n
                self.doc = int(np.searchsorted(p.cum, target, side="right")) - 1
                self.offset = target - int(p.cum[self.doc])
                return
            n -= p.total - here
            self.epoch = st.nonempty_epoch(self.epoch + 1)
            self.doc = self.offset = 0

    def read(self, n):
        """The next n positions without moving: (int32 tokens[n], bool starts[n])."""
        st = self.stream
        pieces, start_at = [], []
        got, epoch, doc, offset = 0, self.epoch, self.doc, self.offset
        while got < n:
            p = st.plan(epoch)
            if doc == len(p.ids):
                epoch, doc = st.nonempty_epoch(epoch + 1), 0
                continue
            c = int(p.contrib[doc])
            take = min(c - offset, n - got)
            if offset == 0:
                start_at.append(got)
            parts = st.doc_stream(int(p.ids[doc]))
            if offset == 0 and take == c:
                pieces += parts
            else:
                whole = np.concatenate(parts, dtype=np.int32, casting="unsafe")
                pieces.append(whole[offset:offset + take])
            got += take
            doc, offset = doc + 1, 0
        tokens = np.concatenate(pieces, dtype=np.int32, casting="unsafe")
        starts = np.zeros(n, bool)
        starts[start_at] = True
        return tokens, starts


# --------------------------------------------------------------------------
# Packing modes "pad" and "bestfit", and mixtures (docs/sample-order.md,
# sections 11 to 14). Written from those sections; deliberately naive (best
# fit scans every row), so it shares no shape with the daemon's treap.
#
#   rank_documents(stream) -> iter of Doc        a rank's non-empty documents
#   mixed_documents(doc_iters, seed, units) -> iter of Doc
#   mix_parse_weight(text) -> units (int)        "0.7" -> 700000000
#   mix_source(seed, units, k) -> source index of the k-th document
#   bestfit_pack(lengths, seq_len) -> [[(doc, offset, length), ...] per row]
#   pad_batches(docs, seq_len, batch_size, pad_id) -> iter of dict
#   bestfit_batches(docs, seq_len, batch_size, buffer_tokens, pad_id)
#       -> iter of dict
#   padded_batch(rows, seq_len, pad_id) -> dict of int32 arrays
#
# A padded batch dict holds input_ids, labels, position_ids (int32 [B, L]),
# cu_seqlens, epoch, batch, n_docs and the counters tokens, truncated,
# cut_docs (section 13). bestfit batches also carry `resume`: (the index,
# counted from 0 in the document iterator, of the first document of the
# buffer holding the next batch's first row, that row) -- the cursor of
# section 12.5 in document numbers.

LABEL_IGNORE = -100
MIX_TAG = 0x6D69787475726531          # "mixture1"
MIX_UNITS = 10 ** 9                   # units per weight of 1
MIX_MAX_SOURCES = 8


class Doc:
    """One document's contribution: tokens (int32 array, bos/eos included)."""

    def __init__(self, tokens, epoch=0, source=0, key=None):
        self.tokens = np.asarray(tokens, np.int32)
        self.epoch, self.source, self.key = epoch, source, key

    def __len__(self):
        return len(self.tokens)


def rank_documents(stream):
    """A RankStream's non-empty documents in stream order, across epochs."""
    e = stream.nonempty_epoch(0)
    while True:
        p = stream.plan(e)
        for gid in p.ids.tolist():
            parts = stream.doc_stream(gid)
            yield Doc(np.concatenate(parts, dtype=np.int32, casting="unsafe"), e, 0, gid)
        e = stream.nonempty_epoch(e + 1)


def mix_parse_weight(text):
    """A weight as an integer count of 1e-9: decimal, at most 9 digits after
    the point, above 0, at most 1000000. Raises ValueError otherwise."""
    whole, dot, frac = text.partition(".")
    if not whole or not whole.isdigit() or not whole.isascii():
        raise ValueError(f"weight {text!r}")
    if dot and (not frac or not frac.isdigit() or not frac.isascii() or len(frac) > 9):
        raise ValueError(f"weight {text!r}")
    units = int(whole) * MIX_UNITS + int((frac or "0").ljust(9, "0"))
    if not 0 < units <= 10 ** 6 * MIX_UNITS:
        raise ValueError(f"weight {text!r} outside (0, 1000000]")
    return units


def mix_source(seed, units, k):
    """Section 14.2: the source of the k-th document of the mixed stream."""
    total = sum(units)
    x = (mix((seed & MASK64) ^ MIX_TAG) + k * GOLDEN) & MASK64
    prefix = 0
    for i, u in enumerate(units[:-1]):
        prefix += u
        if x < (prefix << 64) // total:
            return i
    return len(units) - 1


def mixed_documents(doc_iters, seed, units):
    """Document k comes from the next document of source mix_source(k)."""
    k = 0
    while True:
        i = mix_source(seed, units, k)
        d = next(doc_iters[i])
        yield Doc(d.tokens, d.epoch, i, d.key)
        k += 1


def bestfit_pack(lengths, seq_len):
    """Section 12.3, literally: chunks, sort by (length desc, buffer order),
    each into the fitting row with least room (oldest on ties), else a new
    row. Returns the rows, each [(doc, offset, length)] in placement order."""
    items = []
    for d, c in enumerate(lengths):
        if c <= 0:
            raise ValueError(f"document {d} has length {c}")
        for off in range(0, c, seq_len):
            items.append((min(seq_len, c - off), len(items), d, off))
    items.sort(key=lambda it: (-it[0], it[1]))
    rows, room = [], []
    for length, _, d, off in items:
        best = None
        for r in range(len(rows)):
            if room[r] >= length and (best is None or room[r] < room[best]):
                best = r
        if best is None:
            rows.append([])
            room.append(seq_len)
            best = len(rows) - 1
        rows[best].append((d, off, length))
        room[best] -= length
    return rows


def padded_batch(rows, seq_len, pad_id):
    """Section 13: rows of pieces -> arrays. rows: B lists of (tokens, starts)
    where tokens is a piece of a contribution and starts says it begins the
    document. Every piece is a segment; so is each row's padding."""
    B = len(rows)
    ids = np.full((B, seq_len), pad_id, np.int32)
    labels = np.full((B, seq_len), LABEL_IGNORE, np.int32)
    pos = np.zeros((B, seq_len), np.int32)
    cu, n_docs = [], 0
    for r, pieces in enumerate(rows):
        col = 0
        for tokens, starts in pieces:
            n = len(tokens)
            assert 1 <= n and col + n <= seq_len
            ids[r, col:col + n] = tokens
            labels[r, col:col + n - 1] = tokens[1:]
            pos[r, col:col + n] = np.arange(n)
            cu.append(r * seq_len + col)
            n_docs += bool(starts)
            col += n
        if col < seq_len:
            cu.append(r * seq_len + col)
            pos[r, col:] = np.arange(seq_len - col)
    cu.append(B * seq_len)
    return {"input_ids": ids, "labels": labels, "position_ids": pos,
            "cu_seqlens": np.array(cu, np.int32), "n_docs": n_docs}


def pad_batches(docs, seq_len, batch_size, pad_id, start_batch=0):
    """Section 11: one document per row, cut to seq_len (the tail is dropped)."""
    docs = iter(docs)
    b = start_batch
    while True:
        ds = [next(docs) for _ in range(batch_size)]
        batch = padded_batch([[(d.tokens[:seq_len], True)] for d in ds], seq_len, pad_id)
        batch.update(batch=b, epoch=ds[0].epoch,
                     tokens=sum(min(len(d), seq_len) for d in ds),
                     truncated=sum(max(len(d) - seq_len, 0) for d in ds), cut_docs=0)
        yield batch
        b += 1


def bestfit_batches(docs, seq_len, batch_size, buffer_tokens, pad_id, start_batch=0):
    """Section 12: buffers of at least buffer_tokens positions, packed by
    bestfit_pack, rows taken batch_size at a time across buffers."""
    docs = iter(docs)
    taken = 0                     # documents taken from `docs`
    rows, at, buf_start = [], 0, 0
    b = start_batch
    while True:
        out = []                  # B rows of [(Doc, offset, length)]
        for _ in range(batch_size):
            if at == len(rows):
                buf_start, buf, total = taken, [], 0
                while total < buffer_tokens:
                    buf.append(next(docs))
                    total += len(buf[-1])
                taken += len(buf)
                rows = [[(buf[d], off, n) for d, off, n in row]
                        for row in bestfit_pack([len(d) for d in buf], seq_len)]
                at = 0
            out.append(rows[at])
            at += 1
        batch = padded_batch([[(d.tokens[off:off + n], off == 0) for d, off, n in row] for row in out],
                             seq_len, pad_id)
        pieces = [p for row in out for p in row]
        batch.update(batch=b, epoch=out[0][0][0].epoch, truncated=0,
                     tokens=sum(n for _, _, n in pieces),
                     cut_docs=sum(off == 0 and n < len(d) for d, off, n in pieces),
                     resume=(buf_start, at) if at < len(rows) else (taken, 0))
        yield batch
        b += 1


# --------------------------------------------------------------------------
# Section 17: virtual ranks. Virtual stream v is the stream of rank v of world
# V' cut into batches of ONE row (every packing mode and mixture as written
# for ranks); a rank's batch takes its B rows from the streams it serves.

def effective_vranks(virtual_ranks, docs_per_source):
    """V' = min(virtual_ranks, documents of one epoch of the smallest source)."""
    return max(1, min([virtual_ranks] + list(docs_per_source)))


def virtual_streams(vranks, world, rank):
    """The virtual streams rank `rank` of `world` serves: v mod world == rank, ascending."""
    if not 1 <= world <= vranks or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of world {world} with {vranks} virtual ranks")
    return list(range(rank, vranks, world))


def virtual_batches(rows_of, streams, batch_size, seq_len, start=None, start_batch=0):
    """A rank's batches. rows_of(v, first_row) -> iterator of the one-row batches of
    virtual stream v from its row first_row on; start: {v: rows already delivered}
    (a resumed state; missing streams are at row 0). Each row comes from the live
    stream with the fewest rows delivered, the smallest v on ties; a stream that
    raises RuntimeError (no token, section 6) is dead and skipped."""
    rows = {v: (start or {}).get(v, 0) for v in streams}
    its = {v: rows_of(v, rows[v]) for v in streams}
    dead = set()
    b = start_batch
    while True:
        out = []
        while len(out) < batch_size:
            live = [v for v in streams if v not in dead]
            if not live:
                raise RuntimeError("every virtual stream of this rank ran dry")
            v = min(live, key=lambda x: (rows[x], x))
            try:
                row = next(its[v])
            except RuntimeError:
                dead.add(v)
                continue
            out.append((v, rows[v], row))
            rows[v] += 1
        cu = []
        for i, (_, _, row) in enumerate(out):
            cu.extend((np.asarray(row["cu_seqlens"][:-1], np.int64) + i * seq_len).tolist())
        cu.append(batch_size * seq_len)
        batch = {k: np.concatenate([row[k] for _, _, row in out]) for k in ("input_ids", "labels", "position_ids")}
        batch.update(cu_seqlens=np.array(cu, np.int32), epoch=out[0][2]["epoch"], batch=b,
                     rows=[(v, j) for v, j, _ in out])
        yield batch
        b += 1


def virtual_epoch_info(row_epochs, batch_size, start=None, start_batch=0):
    """Section 17.10, by brute force: row_epochs {v: [epoch of row 0, 1, ...]} of the rank's
    live streams (long enough to reach past the epoch asked), start {v: rows delivered}.
    The rank's rows are the pairs (j, v) with j < start[v] sorted, then those with
    j >= start[v] sorted; batch start_batch begins at the first of the latter, batch t
    at B*(t - start_batch) from it (t >= 0, inside the list). F(e) = the first batch whose
    row 0 has epoch >= e; the epoch asked is the largest e with F(e) <= start_batch.
    Returns (epoch, first_batch, batches)."""
    start = start or {}
    levels = min(len(r) for r in row_epochs.values())
    past = sorted((j, v) for v in row_epochs for j in range(start.get(v, 0)))
    future = sorted((j, v) for v in row_epochs for j in range(start.get(v, 0), levels))
    seq = past + future
    p0 = len(past)
    batch_epochs = {}
    t = start_batch - p0 // batch_size
    while t < 0 or p0 + (t - start_batch) * batch_size < 0:
        t += 1
    while p0 + (t - start_batch) * batch_size < len(seq):
        j, v = seq[p0 + (t - start_batch) * batch_size]
        batch_epochs[t] = row_epochs[v][j]
        t += 1

    def first(e):
        got = [b for b, x in sorted(batch_epochs.items()) if x >= e]
        if not got:
            raise ValueError("row_epochs too short for the epoch asked")
        return got[0]

    es = sorted(set(batch_epochs.values()))
    e = max(x for x in es if first(x) <= start_batch)
    return e, first(e), first(e + 1) - first(e)
