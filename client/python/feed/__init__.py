# SPDX-License-Identifier: MIT
"""feed: PyTorch (and numpy) batches from feedd, read in place from shared memory.

    import feed
    loader = feed.Loader("web")            # rank/world from $RANK/$WORLD_SIZE (torchrun)
    for step, batch in enumerate(loader):  # dict: input_ids, labels, position_ids, cu_seqlens
        loss = model(**batch)
        if step % 1000 == 0:
            save({"model": ..., "data": loader.state_dict()})
    loader.load_state_dict(ckpt["data"])   # after a crash: continues with the next batch

A thin ctypes layer over libfeed (the protocol is implemented there only).
See docs/python.md for the lifetime, copy and telemetry rules.
"""

from .loader import (Batch, DaemonGoneError, DeviceUnavailableError, FeedError, FeedNotFoundError,
                     FeedTimeoutError, Loader,
                     SlotsExhaustedError, StateError)

__version__ = "0.1.0"
__all__ = ["Loader", "Batch", "FeedError", "FeedNotFoundError", "DaemonGoneError", "FeedTimeoutError", "StateError",
           "SlotsExhaustedError", "DeviceUnavailableError"]
