# SPDX-License-Identifier: MIT
"""A scripted trainer for tests/integration/test_verdicts.py: a real feed.Loader loop.

verdict_client.py SOCKET FEED RANK WORLD STEP_MS [KEEP] [SPIN]

Takes batches for ever with `for b in loader:` and a step of STEP_MS per
batch (a sleep, or with SPIN=1 a busy loop), so while it steps it holds the
batch it works on and, until the Loader gives it back, the previous one. KEEP
> 0 keeps the last KEEP batches alive as well (a trainer that sits on slots).
Prints "attached" after its first batch.
"""
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import feed  # noqa: E402


def main():
    sock, name, rank, world, step_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    keep = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    spin = len(sys.argv) > 7 and sys.argv[7] == "1"
    kept = collections.deque(maxlen=keep or None)
    loader = feed.Loader(name, rank=rank, world_size=world, socket=sock, as_numpy=True)
    first = True
    for b in loader:
        if first:
            print("attached", flush=True)
            first = False
        if keep:
            kept.append(b)
        if spin:
            end = time.perf_counter() + step_ms / 1e3
            while time.perf_counter() < end:
                pass
        elif step_ms > 0:
            time.sleep(step_ms / 1e3)


if __name__ == "__main__":
    main()
