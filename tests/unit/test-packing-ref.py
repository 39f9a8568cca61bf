#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The C packers and mixture against the Python reference, on randomized cases.

    test-packing-ref.py BUILD/tests/unit/test-bestfit BUILD/tests/unit/test-mix

Generates cases with a fixed seed (so a failure reproduces), feeds them to
the C drivers (`--driver`, see test-bestfit.c and test-mix.c) and compares
every batch array, counter and epoch, every mixture choice and every parsed
weight with tests/ref/feed_ref.py (docs/sample-order.md, sections 11 to 14).
bestfit cases resume half-way from the cursor of section 12.5, so resuming is
checked against a reference that never stopped.
"""

import os
import random
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import numpy as np  # noqa: E402
import feed_ref as R  # noqa: E402


def cyc_token(i, idx, o):
    """Token at position o of document idx of source i (as test-bestfit.c's cyc_token)."""
    return ((i * 131071 + idx) * 8191 + o) % 999983


def cyc_docs(i, lens):
    idx = 0
    while True:
        n = lens[idx % len(lens)]
        yield R.Doc([cyc_token(i, idx, o) for o in range(n)], idx // len(lens), i, idx)
        idx += 1


def make_case(rng):
    L = rng.choice([1, 2, 3, 7, 8, 16, 31, 64])
    n_src = rng.choice([1, 1, 2, 3])
    case = {
        "mode": rng.choice(["bestfit", "bestfit", "pad"]),
        "L": L, "B": rng.randint(1, 5), "buffer": rng.choice([1, L, 3 * L, rng.randint(1, 20 * L)]),
        "pad": rng.randint(-2, 5), "seed": rng.getrandbits(64), "batches": rng.randint(1, 14),
        "sources": [],
    }
    case["resume"] = rng.randint(0, case["batches"])
    for _ in range(n_src):
        units = rng.choice([rng.randint(1, 10 ** 9), 10 ** 9, rng.randint(1, 10 ** 15)])
        n = rng.randint(1, 25)
        top = rng.choice([L, 2 * L, 4 * L + 3])
        case["sources"].append((units, [rng.randint(1, top) for _ in range(n)]))
    return case


def case_line(c):
    words = [c["mode"], c["L"], c["B"], c["buffer"], c["pad"], c["seed"], c["batches"], c["resume"],
             len(c["sources"])]
    for units, lens in c["sources"]:
        words += [units, len(lens)] + lens
    return " ".join(map(str, words))


def reference(c):
    iters = [cyc_docs(i, lens) for i, (_, lens) in enumerate(c["sources"])]
    units = [u for u, _ in c["sources"]]
    docs = iters[0] if len(iters) == 1 else R.mixed_documents(iters, c["seed"], units)
    if c["mode"] == "bestfit":
        gen = R.bestfit_batches(docs, c["L"], c["B"], c["buffer"], c["pad"])
    else:
        gen = R.pad_batches(docs, c["L"], c["B"], c["pad"])
    return [next(gen) for _ in range(c["batches"])]


def parse_driver(text):
    """Batches printed by test-bestfit --driver, split into cases at "end"."""
    cases, cur, batch = [], [], None
    for line in text.splitlines():
        w = line.split()
        if w[0] == "end":
            cases.append(cur)
            cur = []
        elif w[0] == "batch":
            batch = dict(zip(w[0::2], map(int, w[1::2])))
            cur.append(batch)
        else:
            batch[w[0]] = np.array(list(map(int, w[1:])), np.int64)
    return cases


def compare(n, c, got, want):
    errors = []
    if len(got) != len(want):
        return [f"case {n}: {len(got)} batches, expected {len(want)}"]
    for g, w in zip(got, want):
        b = w["batch"]
        for key, wkey in (("batch", "batch"), ("epoch", "epoch"), ("tokens", "tokens"),
                          ("truncated", "truncated"), ("docs", "n_docs"), ("cut", "cut_docs")):
            if g[key] != w[wkey]:
                errors.append(f"case {n} batch {b}: {key} {g[key]}, reference {w[wkey]}")
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            gw, ww = g[key], np.asarray(w[key]).reshape(-1)
            if len(gw) != len(ww) or np.any(gw != ww):
                errors.append(f"case {n} batch {b}: {key}\n  C:         {gw.tolist()}\n"
                              f"  reference: {ww.tolist()}")
    if errors:
        errors.insert(0, f"case {n}: {case_line(c)}")
    return errors


def check_packers(bestfit_driver, rng, n_cases):
    cases = [make_case(rng) for _ in range(n_cases)]
    out = subprocess.run([bestfit_driver, "--driver"], input="\n".join(map(case_line, cases)) + "\n",
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return [f"test-bestfit --driver exited with {out.returncode}: {out.stderr}"]
    got = parse_driver(out.stdout)
    if len(got) != len(cases):
        return [f"test-bestfit --driver answered {len(got)} of {len(cases)} cases"]
    errors = []
    for n, (c, g) in enumerate(zip(cases, got)):
        errors += compare(n, c, g, reference(c))
    return errors


def check_mix(mix_driver, rng):
    lines, want = [], []
    for _ in range(60):
        seed = rng.getrandbits(64)
        units = [rng.choice([rng.randint(1, 10 ** 9), rng.randint(1, 10 ** 15), 1])
                 for _ in range(rng.randint(1, 8))]
        K = 3000
        lines.append(" ".join(map(str, [seed, len(units)] + units + [K])))
        want.append("".join(str(R.mix_source(seed, units, k)) for k in range(K)))
    texts = ["0.7", "1", "12.5", "0.000000001", "1000000", "1000000.1", "0", "00.50", "1.", ".1",
             "0.1234567891", "3.141592653"]
    for _ in range(100):
        texts.append(f"{rng.randint(0, 1200000)}.{rng.randint(0, 10 ** rng.randint(1, 10))}")
    for t in texts:
        lines.append(f"weight {t}")
        try:
            want.append(str(R.mix_parse_weight(t)))
        except ValueError:
            want.append("invalid")
    out = subprocess.run([mix_driver, "--driver"], input="\n".join(lines) + "\n",
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return [f"test-mix --driver exited with {out.returncode}: {out.stderr}"]
    got = out.stdout.splitlines()
    errors = []
    for line, g, w in zip(lines, got, want):
        if g != w:
            errors.append(f"mixture: input {line[:80]!r}: C {g[:60]!r}..., reference {w[:60]!r}...")
    if len(got) != len(want):
        errors.append(f"test-mix --driver answered {len(got)} of {len(want)} lines")
    return errors


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rng = random.Random(20240909)
    errors = check_packers(sys.argv[1], rng, 400) + check_mix(sys.argv[2], rng)
    for e in errors[:20]:
        print("FAIL", e)
    if errors:
        print(f"{len(errors)} difference(s) between the C packers and tests/ref/feed_ref.py")
        return 1
    print("C packers and mixture agree with tests/ref/feed_ref.py on 400 packing cases, 60 mixtures, "
          f"{112} weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
