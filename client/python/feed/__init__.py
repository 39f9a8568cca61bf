# SPDX-License-Identifier: MIT
"""feed: PyTorch (and numpy) batches from feedd, read in place from shared memory.

    import feed
    loader = feed.Loader("web")            # rank/world from $RANK/$WORLD_SIZE (torchrun)
    for step, batch in enumerate(loader):  # dict: input_ids, labels, position_ids, cu_seqlens
        loss = model(**batch.for_hf()).loss   # a Hugging Face causal LM (labels="hf", the default)
        if step % 1000 == 0:
            save({"model": ..., "data": loader.state_dict()})
    loader.load_state_dict(ckpt["data"])   # after a crash: continues with the next batch

A thin ctypes layer over libfeed (the protocol is implemented there only).
See docs/python.md for the lifetime, copy and telemetry rules.
"""

try:  # the installed distribution's version (pip, meson-python: the meson project version)
    from importlib.metadata import PackageNotFoundError, version as _dist_version
    __version__ = _dist_version("feed")
except PackageNotFoundError:  # run from the source tree, or installed by meson/Debian without metadata
    __version__ = "0.1.0"

from .loader import (IGNORE_INDEX, Batch, DaemonGoneError, DeviceUnavailableError, FeedError,  # noqa: E402
                     FeedNotFoundError, FeedTimeoutError, Loader, ProtocolMismatchError, SlotsExhaustedError,
                     StateError, merge_states)

__all__ = ["Loader", "Batch", "FeedError", "FeedNotFoundError", "DaemonGoneError", "FeedTimeoutError", "StateError",
           "SlotsExhaustedError", "DeviceUnavailableError", "ProtocolMismatchError", "IGNORE_INDEX", "merge_states"]
