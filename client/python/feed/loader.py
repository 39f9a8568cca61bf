# SPDX-License-Identifier: MIT
"""feed.Loader: a rank's batch stream from feedd, as zero-copy tensors.

Objects and who owns what:

- _Conn owns one feed_client (a connection, one attachment, the mapped ring).
  The Loader holds it, and so does every batch still alive from it: the ring
  is unmapped (feed_client_close) only when the Loader has moved on (close,
  load_state_dict) *and* no array of that attachment is referenced any more.
- _Slot is one delivered batch: its struct feed_batch, in delivery order in
  _Conn.held. Its arrays (numpy views, and torch tensors made from them) keep
  an _Owner alive; when the last one is dropped a weakref finalizer marks the
  slot free. Finalizers may run on any thread, so they only set a flag; the
  loader's own thread releases free slots, oldest first, at the next batch
  (libfeed's in-order rule). A batch can never see another batch's data: its
  slot is not given back to the daemon while anything can read it.
  When the finalizer runs on the loader's own thread (the usual case: the
  loop variable is rebound, CPython drops the last reference at once) and
  the loader is not inside libfeed, the slot goes back to feedd right there,
  so a plain `for b in loader:` holds one slot while it trains and two while
  next() hands the following batch over.
- Release is in order, so one batch kept alive also holds every slot after
  it. When no slot is left, next() raises SlotsExhaustedError (it never runs
  the garbage collector inside a training step; it warns once, earlier, when
  an old batch is still alive after the loop moved past it): views already
  handed out cannot be re-pointed at a copy, and copying every batch in case
  it is kept would defeat zero-copy. copy=True avoids the limit.
- Labels: shared memory holds one convention, "shifted" (labels[q] is the
  token after q, docs/sample-order.md). labels="hf" derives the Hugging Face
  convention from it (a copy of one array per batch); the Batch says which
  one it carries (Batch.labels_convention), and for_hf() refuses the other.
"""

import ctypes
import errno
import json
import os
import threading
import warnings
import weakref
from collections import deque

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # numpy-only installs: a plain iterable
    _Base = object

import numpy as np

from . import _lib
from ._lib import lib

# Longest single wait inside libfeed: signals (Ctrl-C) are handled in between.
_WAIT_SLICE_MS = 1000
_ARRAYS = ("input_ids", "labels", "position_ids", "cu_seqlens")
LABELS = ("hf", "shifted")
IGNORE_INDEX = -100
STATE_VERSION = 1


class FeedError(Exception):
    """An error from feedd or libfeed. `code` is the negative errno libfeed returned (or None),
    str(e) is the daemon's own message when it sent one."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class DaemonGoneError(FeedError, ConnectionError):
    """feedd is not running, stopped, or vanished mid-stream."""


class FeedTimeoutError(FeedError, TimeoutError):
    """No batch arrived within the loader's timeout."""


class FeedNotFoundError(FeedError, LookupError):
    """feedd has no feed of that name."""


class StateError(FeedError, ValueError):
    """A state_dict that does not belong to this feed, rank or world size."""


class SlotsExhaustedError(FeedError, RuntimeError):
    """Every ring slot holds a batch that is still referenced."""


class ProtocolMismatchError(FeedError, ConnectionError):
    """feedd and this package's libfeed speak different protocol versions (the daemon refused HELLO)."""


def _version():
    from . import __version__
    return __version__


class DeviceUnavailableError(FeedError, NotImplementedError):
    """GPU delivery was requested and feedd cannot stage batches on that device (str(e) says why:
    no driver or device on feedd's side, with the CUDA error, or none usable in this process)."""


def _strerror(code):
    return lib.feed_strerror(code).decode(errors="replace")


def _raise(code, message, resuming=False):
    message = message or _strerror(code)
    if code in (-errno.ECONNRESET, -errno.ESHUTDOWN, -errno.ECONNREFUSED, -errno.EPIPE):
        raise DaemonGoneError(message, code)
    if code == -errno.ETIMEDOUT:
        raise FeedTimeoutError(message, code)
    if code == -errno.ENOBUFS:
        raise SlotsExhaustedError(message, code)
    if code == -errno.EPROTONOSUPPORT:
        raise ProtocolMismatchError(
            f"{message}: this feed package (version {_version()}, libfeed {lib.path}) and feedd speak different "
            "protocol versions; install the feed package of feedd's release (feedctl --version)", code)
    if resuming and code == -errno.EINVAL:
        raise StateError(message, code)
    raise FeedError(message, code)


def _raise_attach(code, message, resuming):
    if code == -errno.ENOENT:
        raise FeedNotFoundError(message, code)
    _raise(code, message, resuming)


class _Conn:
    """One feed_client: connect, then attach once. Closed when nothing references it."""

    def __init__(self, socket):
        ptr = ctypes.c_void_p()
        why = ctypes.create_string_buffer(1024)
        r = lib.feed_client_connect_err(socket.encode() if socket else None, why, len(why), ctypes.byref(ptr))
        if r < 0:
            where = socket or os.environ.get("FEEDD_SOCKET") or "the default socket"
            # The daemon's own words when it refused us (a limit, access control), else libfeed's.
            msg = why.value.decode(errors="replace") or f"cannot reach feedd at {where}: {_strerror(r)}"
            if r in (-errno.ENOENT, -errno.ECONNREFUSED):
                raise DaemonGoneError(msg, r)
            if r == -errno.EPROTO:  # HELLO's reply unreadable: most likely a feedd of another protocol version
                r = -errno.EPROTONOSUPPORT
            _raise(r, msg)
        self.ptr = ptr
        self.held = deque()  # _Slot, oldest first
        self.slots = 0
        self.device = -1  # the GPU batches are staged on, -1: host batches
        self.thread = threading.get_ident()  # the thread that calls next(): the only one that calls libfeed
        self.busy = False  # inside reap() or libfeed: a finalizer must not release now
        # atexit=False: never unmap the ring under arrays still alive at interpreter exit.
        self._close = weakref.finalize(self, lib.feed_client_close, ptr)
        self._close.atexit = False

    def error(self):
        return lib.feed_client_error(self.ptr).decode(errors="replace")

    def attach(self, feed, rank, world, cursor, device=None, fallback=False, reconnect_timeout=0):
        c = cursor.encode() if cursor else None
        lib.feed_client_set_reconnect_timeout(self.ptr, int(reconnect_timeout * 1000))
        if device is None:
            r = lib.feed_client_attach(self.ptr, feed.encode(), rank, world, c)
        else:
            flags = _lib.FEED_ATTACH_HOST_FALLBACK if fallback else 0
            r = lib.feed_client_attach_device(self.ptr, feed.encode(), rank, world, c, device, flags)
        if r == -errno.ENODEV:
            raise DeviceUnavailableError(f"feed.Loader(device='cuda:{device}'): {self.error()}", r)
        if r < 0:
            _raise_attach(r, self.error(), bool(cursor))
        self.slots = lib.feed_client_slots(self.ptr)
        self.device = lib.feed_client_device(self.ptr)
        if device is not None and self.device < 0:
            warnings.warn(f"feed.Loader(device='cuda:{device}'): host batches instead ({self.error()})",
                          RuntimeWarning, stacklevel=4)

    def reap(self):
        """Releases the free slots at the front of the ring, oldest first."""
        if self.busy:
            return
        self.busy = True
        try:
            held = self.held
            while held and held[0].free:
                lib.feed_client_release(self.ptr, ctypes.byref(held.popleft().batch))
        finally:
            self.busy = False

    def slot_freed(self):
        """A batch's last array died: give its slot back now when that is safe (the loader's
        thread, not inside reap or libfeed), else at the next next()."""
        if threading.get_ident() == self.thread and not self.busy:
            self.reap()

    def close(self):
        self._close()


class _Slot:
    __slots__ = ("batch", "free", "conn")

    def __init__(self, batch, conn):
        self.batch = batch
        self.free = False
        self.conn = weakref.ref(conn)  # no cycle: the connection holds its slots

    def mark_free(self):  # weakref callback: any thread, so a flag, then a release only where safe
        self.free = True
        conn = self.conn()
        if conn is not None:
            conn.slot_freed()


class _Owner:
    """What every array of one batch keeps alive: the slot's claim and the connection."""

    __slots__ = ("conn", "__weakref__")

    def __init__(self, conn):
        self.conn = conn


class _Memory:
    """An __array_interface__ over ring memory: numpy keeps it (and its owner) as the array's base."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, addr, shape, owner):
        self.__array_interface__ = {"data": (addr, True), "shape": shape, "typestr": "<i4", "version": 3}
        self.owner = owner


class _Meta:
    """Where a batch sits in the stream, and which label convention it carries."""

    __slots__ = ("index", "epoch", "cursor", "n_docs", "rank", "world_size", "labels_convention",
                 "first_of_epoch")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))


def _meta_property(name, doc):
    return property(lambda self: getattr(self._meta, name), doc=doc)


class Batch(dict):
    """One batch: a dict of input_ids [B, L], labels [B, L], position_ids [B, L] and
    cu_seqlens [n] (plus attention_mask [B, L] when asked for), torch tensors or numpy
    arrays, and its place in the stream (index, epoch, cursor, n_docs, rank, world_size,
    first_of_epoch) and label convention (labels_convention: "hf" or "shifted").

    Zero-copy batches are read-only views of shared memory: clone() gives
    private, writable copies."""

    __slots__ = ("_meta",)

    def __init__(self, *args, meta=None, **kw):
        super().__init__(*args, **kw)
        if meta is None:
            # Rebuilt from a plain dict of our tensors (torch's DataLoader converts a Mapping by calling
            # its type): the tensors remember the batch they came from.
            meta = getattr(self.get("input_ids"), "_feed_meta", None) or _Meta()
        self._meta = meta

    index = _meta_property("index", "batch number in this rank's stream")
    epoch = _meta_property("epoch", "epoch of the batch's first position (docs/sample-order.md)")
    cursor = _meta_property("cursor", "cursor after this batch: attaching with it delivers the next one")
    n_docs = _meta_property("n_docs", "documents that start in this batch")
    rank = _meta_property("rank", "rank this batch was dealt to")
    world_size = _meta_property("world_size", "world size of the attachment")
    labels_convention = _meta_property(
        "labels_convention", '"hf": labels aligned with input_ids (the model shifts); '
        '"shifted": labels[q] is the token after q (Megatron; the loss does not shift)')
    first_of_epoch = _meta_property("first_of_epoch", "True when this batch's epoch differs from the previous "
                                    "batch's (None for a loader's first batch)")

    def _map(self, fn):
        return Batch(((k, fn(v)) for k, v in self.items()), meta=self._meta)

    def clone(self):
        """A private, writable copy of this batch (it holds no ring slot)."""
        return self._map(lambda v: v.clone() if hasattr(v, "clone") else np.array(v))

    def to(self, *args, **kw):
        """Batch.to(device, dtype=None, non_blocking=False): every tensor's .to(...) (torch tensors only).
        A copy to another device holds no ring slot once made."""
        if not all(hasattr(v, "to") for v in self.values()):
            raise TypeError("Batch.to() needs torch tensors (this loader yields numpy arrays: as_numpy=True)")
        return self._map(lambda v: v.to(*args, **kw))

    def for_hf(self):
        """The keyword arguments of a Hugging Face causal LM's forward(): input_ids, labels, position_ids
        (and attention_mask when the loader made one), int64, so that `model(**batch.for_hf())` trains on
        the right targets with the model's own shift (ForCausalLMLoss). Refuses a batch whose labels are
        not in the HF convention: passing shifted labels to a model that shifts again would train on the
        token two ahead, silently."""
        if self.labels_convention is None:
            raise ValueError("Batch.for_hf(): this batch does not say which label convention it carries (it was "
                             "rebuilt from a plain dict, e.g. by pin_memory); call for_hf() first, as a DataLoader's "
                             "collate_fn=feed.Batch.for_hf")
        if self.labels_convention != "hf":
            raise ValueError(
                f"Batch.for_hf(): this batch's labels are {self.labels_convention!r} (labels[q] is already the "
                "token after q); a Hugging Face model shifts them again and would learn the token two ahead. "
                "Use feed.Loader(..., labels=\"hf\"), or pass labels to a loss that does not shift")
        keys = ("input_ids", "labels", "position_ids", "attention_mask")
        out = {}
        for k in keys:
            if k in self:
                v = self[k]
                out[k] = v.long() if hasattr(v, "long") else np.asarray(v, np.int64)
        return out

    def __reduce__(self):
        return (_rebuild_batch, (dict(self), {k: getattr(self._meta, k) for k in _Meta.__slots__}))

    def __repr__(self):
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.items())
        return f"Batch(index={self.index}, epoch={self.epoch}, labels={self.labels_convention!r}, {shapes})"


def _rebuild_batch(items, meta):
    return Batch(items, meta=_Meta(**meta))


def _hf_labels(shifted, xp_empty):
    """HF-convention labels from shifted ones: hf[q] = shifted[q - 1] over the flattened batch.

    shifted[q - 1] is the token at q unless q starts a document (or a piece, or padding: -100), which is
    exactly the label HF wants at q; across a row boundary it is the next row's first token, or -100 when
    that row starts a document. The batch's very first position gets -100: a shift-inside loss never
    reads column 0."""
    flat = shifted.reshape(-1)
    out = xp_empty(flat)
    out[1:] = flat[:-1]
    out[0] = IGNORE_INDEX
    return out.reshape(shifted.shape)


def _attention_mask(ids, shifted, pos, pad_id):
    """1 on real positions, 0 on a row's trailing padding (padded modes, docs/sample-order.md section 13).

    A row's last segment starts at L-1 - position_ids[:, -1]; it is padding when all its labels are -100
    and all its ids are pad_id (a real piece of two or more positions has a label). A one-position piece
    made of pad_id is taken for padding: harmless, its label is -100 and it attends only to itself."""
    L = ids.shape[1]
    if hasattr(ids, "new_ones"):
        import torch
        col = torch.arange(L, device=ids.device)
    else:
        col = np.arange(L)
    start = (L - 1) - pos[:, -1:]
    tail = col[None, :] >= start
    is_pad = (((shifted == IGNORE_INDEX) & (ids == pad_id)) | ~tail).all(1)
    mask = ~(tail & is_pad[:, None])
    return mask.to(ids.dtype) if hasattr(mask, "to") else mask.astype(ids.dtype)


def _env_int(names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v), n
            except ValueError:
                raise ValueError(f"feed.Loader: ${n}={v!r} is not an integer") from None
    return None, None


def _rank_world(rank, world_size):
    src = []
    if rank is None:
        rank, n = _env_int(("RANK", "SLURM_PROCID"))
        src.append(f"${n}" if n else "default 0")
        rank = 0 if rank is None else rank
    if world_size is None:
        world_size, n = _env_int(("WORLD_SIZE", "SLURM_NTASKS"))
        src.append(f"${n}" if n else "default 1")
        world_size = 1 if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        how = f" (from {', '.join(src)})" if src else ""
        raise ValueError(f"feed.Loader: rank {rank} is not in a world of size {world_size}{how}")
    return rank, world_size


def _check_device(device):
    """'cpu' -> None; 'cuda' / 'cuda:N' (or a torch.device) -> N."""
    text = str(device)
    if text == "cpu":
        return None
    kind, _, index = text.partition(":")
    if kind == "cuda" and (index == "" or index.isdigit()):
        return int(index or 0)
    raise ValueError(f"feed.Loader: device must be 'cpu', 'cuda' or 'cuda:N', not {text!r}")


class Loader(_Base):
    """Iterates over one rank's batches of a feed (an infinite stream across epochs).

    Loader(feed, rank=None, world_size=None, socket=None, device="cpu",
           timeout=120.0, copy=False, as_numpy=False, allow_host_fallback=False,
           labels="hf", dtype=None, attention_mask=False, on_epoch_end=None,
           reconnect_timeout=300.0)

    rank / world_size default to $RANK / $WORLD_SIZE (torchrun), else
    $SLURM_PROCID / $SLURM_NTASKS, else 0 / 1. socket defaults to libfeed's
    ($FEEDD_SOCKET, then the default path). timeout: seconds to wait for one
    batch (None: forever). See docs/python.md for the lifetime rules.

    labels="hf" (default): labels aligned with input_ids, -100 on each
    document's first position and on padding, for losses that shift inside
    (Hugging Face's ForCausalLMLoss); labels="shifted": labels[q] is the
    token after q, -100 before a document starts (Megatron; the loss must not
    shift). Every Batch says which it carries (labels_convention).
    dtype=torch.int64 (or np.int64): every array converted (a copy: the slot
    goes back at once). attention_mask=True: an attention_mask [B, L], 0 on
    padding (padded packing modes; all ones for "concat").
    on_epoch_end(loader, epoch): called when the first batch of a later epoch
    arrives, before it is returned.
    reconnect_timeout: when feedd goes away (a crash, a restart, a package
    upgrade), next() waits up to this many seconds for it to come back and
    goes on exactly after the last batch it returned; batches held stay
    valid (with device="cuda:N" the new daemon's buffers are imported). A
    Ctrl-C meanwhile raises KeyboardInterrupt at once. 0: raise
    DaemonGoneError at once instead.

    A torch IterableDataset: DataLoader(loader, batch_size=None,
    num_workers=0) yields its batches unchanged.

    device="cuda:N": feedd stages every batch on GPU N as well and the loader
    yields CUDA tensors over those buffers (DLPack, no copy, no CPU wait; see
    docs/gpu.md). Without GPU staging it raises DeviceUnavailableError with
    the reason, or, with allow_host_fallback=True, warns and yields host
    tensors.
    """

    def __init__(self, feed, rank=None, world_size=None, socket=None, device="cpu", timeout=120.0, copy=False,
                 as_numpy=False, allow_host_fallback=False, labels="hf", dtype=None, attention_mask=False,
                 on_epoch_end=None, reconnect_timeout=300.0):
        self._device = _check_device(device)
        self._fallback = bool(allow_host_fallback)
        if self._device is not None and (as_numpy or copy):
            raise ValueError("feed.Loader: device='cuda:N' yields zero-copy CUDA tensors; as_numpy and copy "
                             "do not apply")
        if not isinstance(feed, str) or not feed:
            raise ValueError("feed.Loader: feed must be a non-empty feed name")
        if labels not in LABELS:
            raise ValueError(f"feed.Loader: labels must be one of {LABELS}, not {labels!r} (docs/python.md, "
                             "\"Labels\")")
        if on_epoch_end is not None and not callable(on_epoch_end):
            raise ValueError("feed.Loader: on_epoch_end must be callable(loader, epoch)")
        self._feed = feed
        self._rank, self._world = _rank_world(rank, world_size)
        self._socket = os.fspath(socket) if socket is not None else None
        if timeout is not None and timeout < 0:
            raise ValueError("feed.Loader: timeout must be >= 0 seconds, or None")
        self._timeout = timeout
        if reconnect_timeout is None or reconnect_timeout < 0:
            raise ValueError("feed.Loader: reconnect_timeout must be >= 0 seconds (0: do not reconnect)")
        self._reconnect_timeout = reconnect_timeout
        self._copy = bool(copy)
        self._labels = labels
        self._want_mask = bool(attention_mask)
        self._on_epoch_end = on_epoch_end
        self._torch = None
        if not as_numpy:
            try:
                import torch
            except ImportError as e:
                raise ImportError("feed.Loader yields torch tensors: install torch, or pass as_numpy=True") from e
            self._torch = torch
        self._dtype = self._check_dtype(dtype)
        self._cursor = None    # cursor after the last batch returned to the user
        self._next_index = 0   # index of the batch that follows it
        self._epoch = None     # epoch of the last batch returned
        self._epoch_len = None  # the last epoch_info() answer, while the next batch is one of its epoch
        self._conn = None
        self._closed = False
        self._lower = None
        self._warned_held = False
        self._pid = os.getpid()
        self._attach(None)
        self._pad_id = self._feed_pad_id() if self._want_mask else None

    def _check_dtype(self, dtype):
        if dtype is None:
            return None
        if self._torch is not None:
            if not isinstance(dtype, self._torch.dtype):
                raise ValueError(f"feed.Loader: dtype must be a torch.dtype (torch.int64), not {dtype!r}")
            return dtype
        return np.dtype(dtype)

    def _feed_pad_id(self):
        """The feed's pad_id when its packing pads rows, else None (from feedd's status)."""
        for f in self.status().get("feeds", []):
            if f.get("name") == self._feed:
                packing = f.get("packing") or {}
                return packing.get("pad_id") if packing.get("mode") not in (None, "concat") else None
        return None

    # -- the stream ---------------------------------------------------------

    def _attach(self, cursor):
        # The new attachment first: a refused state leaves the loader where it was.
        conn = _Conn(self._socket)
        try:
            conn.attach(self._feed, self._rank, self._world, cursor, self._device, self._fallback,
                        self._reconnect_timeout)
        except BaseException:
            conn.close()  # now, not when the traceback that holds it goes
            raise
        old, self._conn = self._conn, conn
        if old is not None:
            old.reap()  # closed now, or when its last batch is dropped

    def __iter__(self):
        if self._torch is not None and os.getpid() != self._pid:
            info = self._torch.utils.data.get_worker_info()
            where = f"DataLoader worker {info.id}" if info is not None else f"process {os.getpid()}"
            raise FeedError(f"feed.Loader used in {where}, not the process that created it: a loader cannot cross "
                            "fork(). Use DataLoader(loader, batch_size=None, num_workers=0): feedd already does "
                            "what DataLoader workers would")
        return self

    def _attached(self):
        if self._closed:
            raise FeedError("this feed.Loader is closed")
        return self._conn

    def _check_slots(self, conn):
        conn.reap()
        if len(conn.held) >= 2 and not self._warned_held:
            # The loop moved on and an older batch is still alive: fine for a while, fatal when the ring is full.
            self._warned_held = True
            warnings.warn(
                f"feed.Loader: batch {conn.held[0].batch.index} is still referenced after the loop moved on; "
                f"it and every batch after it keep their ring slots ({len(conn.held)} of {conn.slots} held). "
                "Keep loss.item() rather than a loss tensor, batch.clone() what you keep, or use "
                "feed.Loader(copy=True)", RuntimeWarning, stacklevel=3)
        if len(conn.held) >= conn.slots:
            oldest = conn.held[0].batch.index
            raise SlotsExhaustedError(
                f"all {conn.slots} ring slots are taken: batch {oldest} is still referenced, and slots go back "
                f"to feedd in order, so the {len(conn.held) - 1} batches after it wait for it too. Drop old "
                "batches (a kept loss tensor keeps its inputs alive through autograd; a reference cycle "
                "keeps them until gc.collect()), keep clones (batch.clone()), or use feed.Loader(copy=True)",
                -errno.ENOBUFS)

    def __next__(self):
        conn = self._attached()
        conn.thread = threading.get_ident()  # the thread that iterates (one at a time) is the one that may release
        self._check_slots(conn)
        b = _lib.feed_batch()
        ref = ctypes.byref(b)
        ptr = conn.ptr
        if self._timeout is None:
            left = None
        else:
            left = int(self._timeout * 1000)
        while True:
            ms = _WAIT_SLICE_MS if left is None else min(left, _WAIT_SLICE_MS)
            r = lib.feed_client_next(ptr, ms, ref)
            if r == -errno.EINTR:  # a signal (Ctrl-C) during a reconnect: its handler runs now, then on
                continue
            if r == -errno.ETIMEDOUT and (left is None or left > ms):
                if left is not None:
                    left -= ms
                continue
            break
        if r == -errno.ETIMEDOUT:
            raise FeedTimeoutError(f"no batch from feed '{self._feed}' within {self._timeout} s "
                                   "(feedd alive but not delivering)", r)
        if r < 0:
            # A refused re-attach after a restart (-ENOENT, -EINVAL) is named as an attach's refusal would be.
            _raise_attach(r, conn.error(), True)
        self._cursor = b.cursor.decode()
        self._next_index = b.index + 1
        if self._device is not None:  # a reconnect imports the new daemon's buffers, or falls back to host batches
            was, conn.device = conn.device, lib.feed_client_device(ptr)
            if was >= 0 > conn.device:
                warnings.warn(f"feed.Loader(device='cuda:{self._device}'): host batches instead after feedd came "
                              f"back ({conn.error()})", RuntimeWarning, stacklevel=2)
        if conn.device >= 0:
            arrays = self._device_views(conn, b)
        elif self._copy:
            arrays = self._copy_out(b)
            lib.feed_client_release(ptr, ref)
        else:
            arrays = self._views(conn, b)
        batch = dict(zip(_ARRAYS, arrays))
        del arrays
        self._convert(batch)
        first = None if self._epoch is None else b.epoch != self._epoch
        meta = _Meta(index=b.index, epoch=b.epoch, cursor=self._cursor, n_docs=b.n_docs, rank=b.rank,
                     world_size=b.world, labels_convention=self._labels, first_of_epoch=first)
        if self._torch is not None:
            batch["input_ids"]._feed_meta = meta  # lets a DataLoader-rebuilt Batch find its metadata
        out = Batch(batch, meta=meta)
        del batch
        if first and self._on_epoch_end is not None:
            self._on_epoch_end(self, self._epoch)
        self._epoch = b.epoch
        return out

    def _convert(self, batch):
        """Label convention, attention mask and dtype, in place on the dict of arrays."""
        torch = self._torch
        if self._labels == "hf":
            empty = torch.empty_like if torch is not None else np.empty_like
            shifted = batch["labels"]
            if self._want_mask:
                batch["attention_mask"] = self._mask(batch, shifted)
            batch["labels"] = _hf_labels(shifted, empty)
        elif self._want_mask:
            batch["attention_mask"] = self._mask(batch, batch["labels"])
        if self._dtype is not None:
            for k, v in batch.items():
                batch[k] = v.to(self._dtype) if torch is not None else v.astype(self._dtype)

    def _mask(self, batch, shifted):
        ids = batch["input_ids"]
        if self._pad_id is None:
            return self._torch.ones_like(ids) if self._torch is not None else np.ones_like(ids)
        return _attention_mask(ids, shifted, batch["position_ids"], self._pad_id)

    @property
    def epoch(self):
        """Epoch of the last batch returned (None before the first)."""
        return self._epoch

    def epoch_info(self):
        """The epoch the next batch belongs to, as feedd measures it (docs/sample-order.md,
        section 16): a dict with "epoch", "batches" (this rank's batches whose epoch it is),
        "first_batch" (the index of the first of them), "remaining" (those from the next
        batch on) and "units" (the rank's positions, or rows with packing "pad", in it).
        Raises TypeError where the feed cannot know it (mixtures, text feeds, bestfit)."""
        conn = self._attached()
        info = self._epoch_len
        nxt = self._next_index
        if info is None or not info["first_batch"] <= nxt < info["first_batch"] + info["batches"]:
            out = _lib.feed_epoch_info()
            c = self._cursor.encode() if self._cursor else None
            r = lib.feed_client_epoch_info(conn.ptr, c, ctypes.byref(out))
            if r == -errno.EOPNOTSUPP:
                raise TypeError(f"len(feed.Loader) is not known for feed '{self._feed}': {conn.error()}")
            if r < 0:
                _raise(r, conn.error())
            info = {k: int(getattr(out, k)) for k in ("epoch", "batches", "first_batch", "units")}
            self._epoch_len = info
        return dict(info, remaining=info["first_batch"] + info["batches"] - nxt)

    def __len__(self):
        """This rank's batches in the loader's current epoch: the epoch of the next batch
        (docs/python.md). It changes from epoch to epoch when the feed shuffles. TypeError
        for feeds that cannot know it (mixtures, text feeds, packing bestfit): use max_steps."""
        return self.epoch_info()["batches"]

    @property
    def labels(self):
        """The label convention of this loader's batches: "hf" or "shifted"."""
        return self._labels

    @staticmethod
    def _shapes(b):
        rows = (b.batch_size, b.seq_len)
        return (b.input_ids, rows), (b.labels, rows), (b.position_ids, rows), (b.cu_seqlens, (b.n_cu_seqlens,))

    def _views(self, conn, b):
        slot = _Slot(b, conn)
        owner = _Owner(conn)
        weakref.finalize(owner, slot.mark_free).atexit = False
        conn.held.append(slot)
        arrays = [np.asarray(_Memory(addr, shape, owner)) for addr, shape in self._shapes(b)]
        if self._torch is None:
            return arrays
        with warnings.catch_warnings():
            # Read-only by design (docs/python.md): torch has no read-only tensors.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writ")
            return [self._torch.from_numpy(a) for a in arrays]

    def _device_views(self, conn, b):
        from . import dlpack
        slot = _Slot(b, conn)
        conn.held.append(slot)
        owner = dlpack.DeviceBatch(conn, b, slot, conn.device)
        fields = ("input_ids", "labels", "position_ids", "cu_seqlens")
        shapes = [shape for _, shape in self._shapes(b)]
        # torch.from_dlpack passes the current stream of that device: it waits on `ready`, not the CPU.
        return [self._torch.from_dlpack(dlpack.DeviceArray(owner, f, s)) for f, s in zip(fields, shapes)]

    def _copy_out(self, b):
        arrays = [np.array(np.asarray(_Memory(addr, shape, None))) for addr, shape in self._shapes(b)]
        if self._torch is None:
            return arrays
        return [self._torch.from_numpy(a) for a in arrays]

    # -- state --------------------------------------------------------------

    def state_dict(self):
        """Where the stream is: the cursor of the last batch returned by the iterator
        (committed on delivery). A plain dict; pickle or JSON it with the checkpoint."""
        return {
            "version": STATE_VERSION,
            "feed": self._feed,
            "rank": self._rank,
            "world_size": self._world,
            "cursor": self._cursor,
            "next_batch": self._next_index,
        }

    def load_state_dict(self, state):
        """Continues from a state_dict(): the next batch is the one after the state's.
        Raises StateError for a state of another feed, rank or world size (checked here,
        and by feedd against the feed's configuration)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or "cursor" not in state:
            raise StateError(f"not a feed.Loader state_dict (version {STATE_VERSION}): {state!r:.200}")
        mine = (self._feed, self._world, self._rank)
        theirs = (state.get("feed"), state.get("world_size"), state.get("rank"))
        if theirs[1] is None and theirs[2] is None:  # merge_states(): any rank of any world resumes from it
            theirs = (theirs[0], self._world, self._rank)
        if theirs != mine:
            raise StateError(f"state_dict is for feed '{theirs[0]}' rank {theirs[2]} of world {theirs[1]}, "
                             f"this loader reads feed '{mine[0]}' as rank {mine[2]} of world {mine[1]}")
        cursor = state["cursor"]
        if cursor is not None and not isinstance(cursor, str):
            raise StateError(f"state_dict cursor must be a string or None, not {type(cursor).__name__}")
        self._attached()
        self._attach(cursor)
        self._epoch = None
        self._epoch_len = None
        self._cursor = cursor
        self._next_index = int(state.get("next_batch", 0))

    # -- telemetry ------------------------------------------------------------

    def report(self, step_time=None, h2d_time=None):
        """Reports times the trainer measured itself, in seconds (None: not measured):
        the compute time of the last step and the host-to-device copy. No system call."""
        ns = [0 if t is None else max(int(t * 1e9), 0) for t in (step_time, h2d_time)]
        conn = self._attached()
        r = lib.feed_client_report(conn.ptr, ns[0], ns[1])
        if r < 0:
            _raise(r, conn.error())

    def _quantile(self, hist, q):
        if self._lower is None:
            self._lower = [lib.feed_stats_bucket_lower(i) for i in range(_lib.HIST_BUCKETS + 1)]
        total = sum(hist)
        if total == 0:
            return None
        target, acc = q * total, 0
        for i, n in enumerate(hist):
            if n and acc + n >= target:
                lo, hi = self._lower[i], self._lower[i + 1]
                return (lo + (target - acc) / n * (hi - lo)) / 1e9
            acc += n
        return None

    def stats(self):
        """What libfeed measured for this attachment (the figures feedd shows), in seconds:
        batches, wait_s (inside next), step_s (between batches), stall_pct, wait/step
        p50/p99 (from log-linear histograms, about 19 % per bucket), last_wait_s,
        last_step_s, reported_step_s and h2d_s (from report()); reconnects and reconnect_s (the
        times feedd went away and came back, and the time next() spent waiting for it)."""
        s = _lib.feed_stats()
        conn = self._attached()
        r = lib.feed_client_stats(conn.ptr, ctypes.byref(s))
        if r < 0:
            _raise(r, conn.error())
        wait, step = s.wait_ns_total / 1e9, s.step_ns_total / 1e9
        n, ns = ctypes.c_uint64(), ctypes.c_uint64()
        lib.feed_client_reconnect_stats(conn.ptr, ctypes.byref(n), ctypes.byref(ns))
        return {
            "batches": s.delivered,
            "wait_s": wait,
            "step_s": step,
            "stall_pct": 100.0 * wait / (wait + step) if wait + step > 0 else 0.0,
            "wait_p50_s": self._quantile(s.hist_wait, 0.50),
            "wait_p99_s": self._quantile(s.hist_wait, 0.99),
            "step_p50_s": self._quantile(s.hist_step, 0.50),
            "step_p99_s": self._quantile(s.hist_step, 0.99),
            "last_wait_s": s.last_wait_ns / 1e9,
            "last_step_s": s.last_step_ns / 1e9,
            "reported_step_s": s.reported_step_ns_total / 1e9,
            "h2d_s": s.h2d_ns_total / 1e9,
            "reconnects": n.value,
            "reconnect_s": ns.value / 1e9,
        }

    def status(self):
        """feedd's status document (docs/protocol.md section 10) as a dict, over a second connection."""
        c = _Conn(self._socket)
        try:
            out = ctypes.c_void_p()
            r = lib.feed_client_status(c.ptr, ctypes.byref(out))
            if r < 0:
                _raise(r, c.error())
            try:
                return json.loads(ctypes.string_at(out.value).decode())
            finally:
                _lib.libc.free(out)
        finally:
            c.close()

    # -- misc ---------------------------------------------------------------

    @property
    def feed(self):
        return self._feed

    @property
    def rank(self):
        return self._rank

    @property
    def world_size(self):
        return self._world

    @property
    def slots(self):
        """Ring slots: the most zero-copy batches that may be alive at once."""
        return self._attached().slots

    @property
    def held(self):
        """Zero-copy batches delivered and not yet given back to feedd."""
        conn = self._attached()
        conn.reap()
        return len(conn.held)

    def close(self):
        """Detaches. Batches still referenced stay readable; the ring is unmapped after the last."""
        if not self._closed:
            self._closed = True
            conn, self._conn = self._conn, None
            conn.reap()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"feed.Loader({self._feed!r}, rank={self._rank}, world_size={self._world}, "
                f"next_batch={self._next_index})")


def merge_states(states):
    """Elastic resume (feeds with virtual_ranks, docs/sample-order.md, section 17).

    Merges the states of every rank 0 .. R-1 of one world, taken after the same
    step (Loader.state_dict() dicts, or the cursors of their last batches), into
    one global state: every rank of any new world loads it (load_state_dict, or
    attach with the cursor) and continues each virtual stream exactly where it
    stopped, every row delivered once. Returns a dict for dicts, a string for
    strings. Raises StateError when a rank is missing or given twice, or the
    states are of different feeds or worlds."""
    states = list(states)
    dicts = all(isinstance(s, dict) for s in states)
    texts = [s.get("cursor") if isinstance(s, dict) else s for s in states]
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise StateError("merge_states takes the state_dict() (or last cursor) of every rank, each after a batch")
    arr = (ctypes.c_char_p * len(texts))(*[t.encode() for t in texts])
    cap = 64 + sum(len(t) for t in texts)
    buf = ctypes.create_string_buffer(cap)
    err = ctypes.create_string_buffer(512)
    r = lib.feed_merge_states(arr, len(texts), buf, cap, err, len(err))
    if r < 0:
        raise StateError(f"cannot merge the states: {err.value.decode(errors='replace') or _strerror(r)}")
    merged = buf.value.decode()
    if not dicts:
        return merged
    feeds = {s.get("feed") for s in states}
    if len(feeds) != 1:
        raise StateError(f"states of different feeds: {sorted(map(str, feeds))}")
    return {"version": STATE_VERSION, "feed": feeds.pop(), "rank": None, "world_size": None, "cursor": merged,
            "next_batch": max(int(s.get("next_batch", 0)) for s in states)}
