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
- Release is in order, so one batch kept alive also holds every slot after
  it. When no slot is left, next() collects garbage once (a reference cycle
  may be all that keeps a batch alive) and then raises SlotsExhaustedError:
  views already handed out cannot be re-pointed at a copy, and copying every
  batch in case it is kept would defeat zero-copy. copy=True avoids the limit.
"""

import ctypes
import errno
import gc
import json
import os
import threading
import warnings
import weakref
from collections import deque

import numpy as np

from . import _lib
from ._lib import lib

# Longest single wait inside libfeed: signals (Ctrl-C) are handled in between.
_WAIT_SLICE_MS = 1000
_ARRAYS = ("input_ids", "labels", "position_ids", "cu_seqlens")
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
            _raise(r, msg)
        self.ptr = ptr
        self.held = deque()  # _Slot, oldest first
        self.slots = 0
        self.device = -1  # the GPU batches are staged on, -1: host batches
        # atexit=False: never unmap the ring under arrays still alive at interpreter exit.
        self._close = weakref.finalize(self, lib.feed_client_close, ptr)
        self._close.atexit = False

    def error(self):
        return lib.feed_client_error(self.ptr).decode(errors="replace")

    def attach(self, feed, rank, world, cursor, device=None, fallback=False):
        c = cursor.encode() if cursor else None
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
        held = self.held
        while held and held[0].free:
            lib.feed_client_release(self.ptr, ctypes.byref(held.popleft().batch))

    def close(self):
        self._close()


class _Slot:
    __slots__ = ("batch", "free")

    def __init__(self, batch):
        self.batch = batch
        self.free = False

    def mark_free(self):  # weakref callback: any thread, so only a flag
        self.free = True


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


class Batch(dict):
    """One batch: a dict of input_ids [B, L], labels [B, L], position_ids [B, L] and
    cu_seqlens [n] (int32), torch tensors or numpy arrays, plus its place in the stream.

    Zero-copy batches are read-only views of shared memory: clone() gives
    private, writable copies."""

    __slots__ = ("index", "epoch", "cursor", "n_docs", "rank", "world_size")

    def clone(self):
        """A private, writable copy of this batch (it holds no ring slot)."""
        out = Batch((k, v.clone() if hasattr(v, "clone") else np.array(v)) for k, v in self.items())
        for a in Batch.__slots__:
            setattr(out, a, getattr(self, a))
        return out

    def __repr__(self):
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.items())
        return f"Batch(index={self.index}, epoch={self.epoch}, {shapes})"


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


class Loader:
    """Iterates over one rank's batches of a feed (an infinite stream across epochs).

    Loader(feed, rank=None, world_size=None, socket=None, device="cpu",
           timeout=120.0, copy=False, as_numpy=False, allow_host_fallback=False)

    rank / world_size default to $RANK / $WORLD_SIZE (torchrun), else
    $SLURM_PROCID / $SLURM_NTASKS, else 0 / 1. socket defaults to libfeed's
    ($FEEDD_SOCKET, then the default path). timeout: seconds to wait for one
    batch (None: forever). See docs/python.md for the lifetime rules.

    device="cuda:N": feedd stages every batch on GPU N as well and the loader
    yields CUDA tensors over those buffers (DLPack, no copy, no CPU wait; see
    docs/gpu.md). Without GPU staging it raises DeviceUnavailableError with
    the reason, or, with allow_host_fallback=True, warns and yields host
    tensors.
    """

    def __init__(self, feed, rank=None, world_size=None, socket=None, device="cpu", timeout=120.0, copy=False,
                 as_numpy=False, allow_host_fallback=False):
        self._device = _check_device(device)
        self._fallback = bool(allow_host_fallback)
        if self._device is not None and (as_numpy or copy):
            raise ValueError("feed.Loader: device='cuda:N' yields zero-copy CUDA tensors; as_numpy and copy "
                             "do not apply")
        if not isinstance(feed, str) or not feed:
            raise ValueError("feed.Loader: feed must be a non-empty feed name")
        self._feed = feed
        self._rank, self._world = _rank_world(rank, world_size)
        self._socket = os.fspath(socket) if socket is not None else None
        if timeout is not None and timeout < 0:
            raise ValueError("feed.Loader: timeout must be >= 0 seconds, or None")
        self._timeout = timeout
        self._copy = bool(copy)
        self._torch = None
        if not as_numpy:
            try:
                import torch
            except ImportError as e:
                raise ImportError("feed.Loader yields torch tensors: install torch, or pass as_numpy=True") from e
            self._torch = torch
        self._cursor = None    # cursor after the last batch returned to the user
        self._next_index = 0   # index of the batch that follows it
        self._conn = None
        self._closed = False
        self._lower = None
        self._attach(None)

    # -- the stream ---------------------------------------------------------

    def _attach(self, cursor):
        # The new attachment first: a refused state leaves the loader where it was.
        conn = _Conn(self._socket)
        try:
            conn.attach(self._feed, self._rank, self._world, cursor, self._device, self._fallback)
        except BaseException:
            conn.close()  # now, not when the traceback that holds it goes
            raise
        old, self._conn = self._conn, conn
        if old is not None:
            old.reap()  # closed now, or when its last batch is dropped

    def __iter__(self):
        return self

    def _attached(self):
        if self._closed:
            raise FeedError("this feed.Loader is closed")
        return self._conn

    def __next__(self):
        conn = self._attached()
        conn.reap()
        if len(conn.held) >= conn.slots:
            gc.collect()  # a reference cycle may be all that keeps an old batch alive
            conn.reap()
            if len(conn.held) >= conn.slots:
                oldest = conn.held[0].batch.index
                raise SlotsExhaustedError(
                    f"all {conn.slots} ring slots are taken: batch {oldest} is still referenced, and slots go back "
                    f"to feedd in order, so the {len(conn.held) - 1} batches after it wait for it too. Drop old "
                    "batches (a kept loss tensor keeps its inputs alive through autograd), keep clones "
                    "(batch.clone()), or use feed.Loader(copy=True)",
                    -errno.ENOBUFS)
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
            if r == -errno.ETIMEDOUT and (left is None or left > ms):
                if left is not None:
                    left -= ms
                continue
            break
        if r == -errno.ETIMEDOUT:
            raise FeedTimeoutError(f"no batch from feed '{self._feed}' within {self._timeout} s "
                                   "(feedd alive but not delivering)", r)
        if r < 0:
            _raise(r, conn.error())
        self._cursor = b.cursor.decode()
        self._next_index = b.index + 1
        if conn.device >= 0:
            arrays = self._device_views(conn, b)
        elif self._copy:
            arrays = self._copy_out(b)
            lib.feed_client_release(ptr, ref)
        else:
            arrays = self._views(conn, b)
        batch = Batch(zip(_ARRAYS, arrays))
        batch.index, batch.epoch, batch.cursor, batch.n_docs = b.index, b.epoch, self._cursor, b.n_docs
        batch.rank, batch.world_size = b.rank, b.world
        return batch

    @staticmethod
    def _shapes(b):
        rows = (b.batch_size, b.seq_len)
        return (b.input_ids, rows), (b.labels, rows), (b.position_ids, rows), (b.cu_seqlens, (b.n_cu_seqlens,))

    def _views(self, conn, b):
        slot = _Slot(b)
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
        slot = _Slot(b)
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
        if theirs != mine:
            raise StateError(f"state_dict is for feed '{theirs[0]}' rank {theirs[2]} of world {theirs[1]}, "
                             f"this loader reads feed '{mine[0]}' as rank {mine[2]} of world {mine[1]}")
        cursor = state["cursor"]
        if cursor is not None and not isinstance(cursor, str):
            raise StateError(f"state_dict cursor must be a string or None, not {type(cursor).__name__}")
        self._attached()
        self._attach(cursor)
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
        last_step_s, reported_step_s and h2d_s (from report())."""
        s = _lib.feed_stats()
        conn = self._attached()
        r = lib.feed_client_stats(conn.ptr, ctypes.byref(s))
        if r < 0:
            _raise(r, conn.error())
        wait, step = s.wait_ns_total / 1e9, s.step_ns_total / 1e9
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
