# SPDX-License-Identifier: MIT
"""DLPack export of device batches: CUDA tensors over feedd's device buffers, no copy.

Each array of a device batch is a _DeviceArray with __dlpack__ and
__dlpack_device__, so torch.from_dlpack() (or any DLPack consumer) takes it.
Stream semantics follow the DLPack protocol: __dlpack__(stream=s) makes the
consumer's stream s wait on the slot's `ready` event (cuStreamWaitEvent, no
CPU wait) before the capsule is handed over. The capsule's deleter frees
nothing: when the last array of a batch dies it records the slot's `release`
event on that stream (feed_client_device_done) and marks the slot free, and
the loader gives it back to feedd at its next batch, in order.
"""

import ctypes
import sys
import threading

from . import _lib
from ._lib import lib

KDL_CUDA = 2
KDL_INT = 0


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# Raw-pointer variants for the capsule destructor, which must not make a new reference to a dying object.
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_ptr = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# Managed tensors handed out and not yet deleted, by address: they keep their shapes and their batch alive.
_live = {}
_live_lock = threading.Lock()


@_DELETER
def _deleter(managed):
    # At interpreter exit the loader, libfeed's client and ctypes may already be gone; the daemon
    # reclaims the slot when the connection closes, so there is nothing left to give back.
    if sys.is_finalizing():
        return
    with _live_lock:
        entry = _live.pop(ctypes.addressof(managed.contents), None)
    if entry is not None:
        entry[1].array_done()


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(cap):
    # A capsule never consumed still owns its tensor (DLPack rule): delete it here.
    if _capsule_valid(cap, b"dltensor"):
        managed = ctypes.cast(_capsule_ptr(cap, b"dltensor"), ctypes.POINTER(DLManagedTensor))
        _deleter(managed)


class DeviceBatch:
    """One batch's device side: waits queued per consumer stream, `release` recorded when its arrays are gone."""

    def __init__(self, conn, batch, slot, device):
        self.conn, self.batch, self.slot, self.device = conn, batch, slot, device
        self.addrs = None
        self.stream = None
        self.waited = set()
        self.alive = 0
        self.lock = threading.Lock()

    def wait_on(self, stream):
        """Makes `stream` wait until the batch is in device memory; returns the device addresses."""
        if stream not in self.waited:
            out = _lib.feed_device_batch()
            r = lib.feed_client_device_batch(self.conn.ptr, ctypes.byref(self.batch), stream, ctypes.byref(out))
            if r < 0:
                raise RuntimeError(f"feed: cannot hand batch {self.batch.index} to stream {stream}: "
                                   f"{self.conn.error()}")
            self.waited.add(stream)
            self.addrs = out
        self.stream = stream
        return self.addrs

    def array_done(self):
        with self.lock:
            self.alive -= 1
            last = self.alive == 0
        if last:
            # Record `release` where the consumer last read it; the loader returns the slot in order.
            lib.feed_client_device_done(self.conn.ptr, ctypes.byref(self.batch), self.stream)
            self.slot.mark_free()


class DeviceArray:
    """One int32 array of a device batch, exported through DLPack."""

    def __init__(self, owner, field, shape):
        self.owner, self.field, self.shape = owner, field, tuple(shape)
        with owner.lock:
            owner.alive += 1
        self._exported = False

    def __dlpack_device__(self):
        return (KDL_CUDA, self.owner.device)

    def __dlpack__(self, stream=None, **_):
        if self._exported:
            raise BufferError("feed: a device array can be exported once")
        # DLPack: None or 1 is the legacy default stream, 2 the per-thread one, else a cudaStream_t.
        # 0 is ambiguous and disallowed by the spec. -1 asks the producer not to synchronise at all;
        # the consumer cannot know this batch's `ready` event, so skipping the wait would hand it
        # bytes the copy may still be writing: the wait goes on the legacy stream instead (a GPU-side
        # wait, never a CPU one).
        if stream == 0:
            raise BufferError("feed: __dlpack__(stream=0) is ambiguous (DLPack); pass 1 for the default stream")
        handle = None if stream in (None, 1, -1) else stream
        addrs = self.owner.wait_on(handle)
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        m = DLManagedTensor()
        m.dl_tensor.data = getattr(addrs, self.field)
        m.dl_tensor.device = DLDevice(KDL_CUDA, self.owner.device)
        m.dl_tensor.ndim = len(self.shape)
        m.dl_tensor.dtype = DLDataType(KDL_INT, 32, 1)
        m.dl_tensor.shape = shape
        m.dl_tensor.strides = None
        m.dl_tensor.byte_offset = 0
        m.deleter = _deleter
        with _live_lock:
            _live[ctypes.addressof(m)] = (m, self.owner, shape)
        self._exported = True
        return _capsule_new(ctypes.addressof(m), b"dltensor", ctypes.cast(_capsule_destructor, ctypes.c_void_p))

    def __del__(self):
        if not self._exported:
            self.owner.array_done()
