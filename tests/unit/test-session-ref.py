#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""test-session's batches against the Python reference.

    test-session-ref.py BUILD/tests/unit/test-session

Has test-session write its shards (--write), computes every case's batches
with tests/ref/feed_ref.py (docs/sample-order.md), and compares their hashes
with what the C sessions produced (--print). test-session.c embeds the same
values as KNOWN[]: when the shards or the cases there change, this prints
the new ones.
"""

import itertools
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import numpy as np  # noqa: E402
import feed_ref as R  # noqa: E402

# As in test-session.c.
B, L, BUFFER, SEED, EOS, WORLD, RANK, N = 3, 48, 200, 7, 10, 2, 1, 40
WEIGHTS = ["0.6", "0.4"]


def docs(d, src):
    shards = R.load_shards(R.expand_globs([f"{d}/m-{src}/s*.idx"]))
    rs = R.RankStream(shards, SEED, True, 1, WORLD, RANK, eos=EOS)
    return R.rank_documents(rs)


def mixed(d):
    units = [R.mix_parse_weight(w) for w in WEIGHTS]
    return R.mixed_documents([docs(d, "a"), docs(d, "b")], SEED, units)


def concat(documents, n):
    """Contributions back to back, cut into batches (sections 5 and 14.3)."""
    toks = itertools.chain.from_iterable(((t, i == 0) for i, t in enumerate(doc.tokens.tolist())) for doc in documents)
    flat = list(itertools.islice(toks, n * B * L + 1))
    ids = np.array([t for t, _ in flat], np.int32)
    starts = np.array([s for _, s in flat], bool)
    return [R.make_batch(ids[b * B * L:(b + 1) * B * L + 1], starts[b * B * L:(b + 1) * B * L + 1], B, L)
            for b in range(n)]


def bestfit(documents, n):
    return list(itertools.islice(R.bestfit_batches(documents, L, B, BUFFER, EOS), n))


def digest(batches):
    h = 0xCBF29CE484222325
    for b in batches:
        for k in ("input_ids", "labels", "position_ids"):
            for byte in np.ascontiguousarray(b[k], "<i4").tobytes():
                h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([exe, "--write", d], check=True)
        want = {
            "mconcat": digest(concat(docs(d, "a"), N)),
            "mbestfit": digest(bestfit(docs(d, "a"), N)),
            "mmixconcat": digest(concat(mixed(d), N)),
            "mmixbestfit": digest(bestfit(mixed(d), N)),
        }
    out = subprocess.run([exe, "--print"], check=True, capture_output=True, text=True).stdout
    got = dict(line.split() for line in out.splitlines())
    bad = 0
    for name, h in want.items():
        ok = got.get(name) == f"{h:016x}"
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: feed_ref {h:016x}, test-session {got.get(name)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
