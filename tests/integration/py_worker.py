#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A trainer process for test_python.py: one feed.Loader in its own process.

    py_worker.py dump SOCKET FEED N OUT.npz   batches from a Loader whose rank and world
                                             come from the environment, saved to OUT.npz
    py_worker.py write SOCKET FEED            writes into a zero-copy tensor (must fault)
    py_worker.py notorch SOCKET FEED          as_numpy=True with torch made unimportable

Runs with Debian's /usr/bin/python3; the test passes PYTHONPATH and FEEDD_BUILD_DIR.
"""

import json
import sys


def main(argv):
    mode, sock, name = argv[1], argv[2], argv[3]
    if mode == "notorch":
        sys.modules["torch"] = None  # "import torch" now raises ImportError
    import feed

    if mode == "dump":
        import numpy as np
        n, out = int(argv[4]), argv[5]
        loader = feed.Loader(name, socket=sock, as_numpy=True, labels="shifted")  # as feedctl dump writes them
        got = [next(loader).clone() for _ in range(n)]
        np.savez(out, **{k: np.stack([b[k] for b in got]) for k in ("input_ids", "labels", "position_ids")},
                 meta=np.array(json.dumps({"rank": loader.rank, "world": loader.world_size,
                                           "cursors": [b.cursor for b in got]})))
    elif mode == "write":
        loader = feed.Loader(name, socket=sock)
        b = next(loader)
        print("writing", flush=True)
        b["input_ids"][0, 0] = 7  # the ring is mapped read-only: SIGSEGV, never a silent write
        print("wrote", flush=True)
    elif mode == "notorch":
        try:
            feed.Loader(name, socket=sock)
        except ImportError as e:
            print("torch-mode refused:", e)
        loader = feed.Loader(name, socket=sock, as_numpy=True)
        b = next(loader)
        print(type(b["input_ids"]).__name__, b["input_ids"].shape, b["input_ids"].flags.writeable,
              "torch" in sys.modules and sys.modules["torch"] is not None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
