# SPDX-License-Identifier: MIT
"""ctypes bindings of libfeed (client/include/feed/feed.h), and nothing more.

The protocol lives in libfeed only; this module declares its functions and
structs and finds the shared object. Which libfeed is loaded, first match:

1. $FEED_LIBRARY: a path to libfeed.so (an error if it cannot be loaded);
2. libfeed.so.0 next to this file: the copy a wheel bundles (pip install),
   built from the same sources as the package;
3. $FEEDD_BUILD_DIR/client/libfeed.so.0: a meson build tree (the tests);
4. the libdir this package was installed with by meson (_installed.py);
5. the soname "libfeed.so.0", found by the dynamic loader.

ctypes releases the GIL for the length of every call, so a trainer's other
threads run while feed_client_next() waits.
"""

import ctypes
import os

FEED_CURSOR_MAX_LEN = 512
HIST_BUCKETS = 256


class feed_batch(ctypes.Structure):
    """struct feed_batch; the arrays are addresses into the mapped ring."""

    _fields_ = [
        ("index", ctypes.c_uint64),
        ("epoch", ctypes.c_uint64),
        ("rank", ctypes.c_uint32),
        ("world", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
        ("seq_len", ctypes.c_uint32),
        ("input_ids", ctypes.c_void_p),
        ("labels", ctypes.c_void_p),
        ("position_ids", ctypes.c_void_p),
        ("cu_seqlens", ctypes.c_void_p),
        ("n_cu_seqlens", ctypes.c_uint32),
        ("n_docs", ctypes.c_uint32),
        ("cursor", ctypes.c_char_p),
        ("seq", ctypes.c_uint64),
    ]


class feed_stats(ctypes.Structure):
    """struct feed_stats."""

    _fields_ = [
        ("delivered", ctypes.c_uint64),
        ("wait_ns_total", ctypes.c_uint64),
        ("step_ns_total", ctypes.c_uint64),
        ("reported_step_ns_total", ctypes.c_uint64),
        ("h2d_ns_total", ctypes.c_uint64),
        ("last_wait_ns", ctypes.c_uint64),
        ("last_step_ns", ctypes.c_uint64),
        ("hist_wait", ctypes.c_uint64 * HIST_BUCKETS),
        ("hist_step", ctypes.c_uint64 * HIST_BUCKETS),
    ]


class feed_device_batch(ctypes.Structure):
    """struct feed_device_batch: device addresses of a batch's arrays."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("input_ids", "labels", "position_ids", "cu_seqlens")]


class feed_epoch_info(ctypes.Structure):
    """struct feed_epoch_info: the length of an epoch of the rank's stream."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("epoch", "batches", "first_batch", "units")]


# Sizes of the C structs on LP64 (checked by the tests against the header). Not `assert`: python -O strips it.
for _t, _size in ((feed_batch, 88), (feed_stats, 4152)):
    if ctypes.sizeof(_t) != _size:
        raise ImportError(f"feed: struct {_t.__name__} is {ctypes.sizeof(_t)} bytes here, libfeed's is {_size} "
                          "(an LP64 platform is required)")

_P = ctypes.c_void_p
_SIGNATURES = {
    "feed_client_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "feed_client_connect_err": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "feed_client_attach": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p]),
    "feed_client_next": (ctypes.c_int, [_P, ctypes.c_int, ctypes.POINTER(feed_batch)]),
    "feed_client_release": (ctypes.c_int, [_P, ctypes.POINTER(feed_batch)]),
    "feed_client_cursor": (ctypes.c_char_p, [_P]),
    "feed_client_slots": (ctypes.c_uint32, [_P]),
    "feed_client_report": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.c_uint64]),
    "feed_client_stats": (ctypes.c_int, [_P, ctypes.POINTER(feed_stats)]),
    "feed_stats_bucket_lower": (ctypes.c_uint64, [ctypes.c_uint]),
    "feed_client_status": (ctypes.c_int, [_P, ctypes.POINTER(_P)]),
    "feed_client_epoch_info": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(feed_epoch_info)]),
    "feed_client_error": (ctypes.c_char_p, [_P]),
    "feed_client_close": (_P, [_P]),
    "feed_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "feed_client_attach_device": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]),
    "feed_client_device": (ctypes.c_int, [_P]),
    "feed_client_set_reconnect_timeout": (ctypes.c_int, [_P, ctypes.c_int64]),
    "feed_client_reconnect_stats": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64),
                                                   ctypes.POINTER(ctypes.c_uint64)]),
    "feed_client_device_batch": (ctypes.c_int, [_P, ctypes.POINTER(feed_batch), _P,
                                                ctypes.POINTER(feed_device_batch)]),
    "feed_client_device_done": (ctypes.c_int, [_P, ctypes.POINTER(feed_batch), _P]),
    "feed_merge_states": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_char_p,
                                         ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]),
}
FEED_ATTACH_HOST_FALLBACK = 1


def _candidates():
    explicit = os.environ.get("FEED_LIBRARY")
    if explicit:
        return [explicit], True
    out = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfeed.so.0")]
    build = os.environ.get("FEEDD_BUILD_DIR")
    if build:
        out.append(os.path.join(build, "client", "libfeed.so.0"))
    try:
        from . import _installed  # written by meson at install time
        out.append(os.path.join(_installed.LIBDIR, "libfeed.so.0"))
    except ImportError:
        pass
    out.append("libfeed.so.0")
    return out, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for p in paths:
        if os.sep in p and not os.path.exists(p) and not explicit:
            continue
        try:
            lib = ctypes.CDLL(p)
            break
        except OSError as e:
            if explicit:
                raise ImportError(f"feed: cannot load libfeed from $FEED_LIBRARY={p}: {e}") from e
            errors.append(f"{p}: {e}")
    else:
        raise ImportError("feed: cannot find libfeed.so.0 (install feedd's libfeed0 package, pip install the feed "
                          "wheel, which bundles it, or set FEED_LIBRARY to its path); tried: "
                          + "; ".join(errors or ["the dynamic loader's path"]))
    for name, (res, args) in _SIGNATURES.items():
        f = getattr(lib, name, None)
        if f is None:
            raise ImportError(f"feed: {getattr(lib, '_name', p)} has no {name}(): an older libfeed than this "
                              "package (install the libfeed of the same feedd release)")
        f.restype = res
        f.argtypes = args
    lib.path = getattr(lib, "_name", p)
    return lib


lib = _load()
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
libc.free.restype = None
