#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Keeps the layering of the tree and docs/architecture.md's drawing of it honest.

Reads every C file under daemon/, client/ and proto/, builds the room-level
(folder-level) #include graph, and checks it against the dependency table
in docs/architecture.md (between the `layering-table` markers):

  fatal   - an include edge the table does not declare;
          - a library room including a room outside the library or proto/;
          - client/ including a daemon header outside the library's rooms;
          - the library's rooms in the table differ from feedd_lib_sources in
            daemon/meson.build;
          - a log_*() call outside the policy rooms (and log/ itself).
  report  - room-level include cycles, C files over 800 lines, and declared
            edges that no include uses: printed, and fatal only with
            FEEDD_LAYERING_STRICT=1 (cycles and sizes; other helpers are
            removing the last cycle and splitting the big files).

Usage: check-layering.py [SOURCE_ROOT]   (exit 0 pass, 1 fail)
       check-layering.py --self-test      (the checks fail on a tree made to break them)
"""
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STRICT = os.environ.get("FEEDD_LAYERING_STRICT") == "1"
MAX_LINES = 800
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LOG_CALL = re.compile(r"\blog_(?:full|error|warning|notice|info|debug)(?:_errno)?\s*\(")
LAYERS = {"protocol", "library", "daemon", "policy", "client"}


def room_of(rel: str):
    """The room a file belongs to: daemon/<folder>, main, proto, feedctl, libfeed; None outside them."""
    parts = rel.split("/")
    if parts[0] == "daemon":
        if len(parts) == 2:
            return "main" if parts[1] == "main.c" else None
        return parts[1]
    if parts[0] == "proto":
        return "proto"
    if parts[0] == "client":
        if len(parts) > 2 and parts[1] == "feedctl":
            return "feedctl"
        if parts[1] in ("libfeed.c", "include") or parts[1].startswith("libfeed"):
            return "libfeed"
    return None


def c_files():
    for top in ("daemon", "client", "proto"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in (".c", ".h") and p.is_file():
                yield p.relative_to(ROOT).as_posix()


def resolve(rel: str, inc: str):
    """An include's path from the root: as written, or beside the including file."""
    if (ROOT / inc).is_file():
        return inc
    beside = (Path(rel).parent / inc).as_posix()
    if (ROOT / beside).is_file():
        return beside
    if inc.startswith("feed/"):  # the public header, client/include/feed/feed.h
        return "client/include/" + inc
    return None


def read_table():
    """The rooms table of docs/architecture.md: room -> (layer, set of rooms it may include)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- layering-table begin -->(.*?)<!-- layering-table end -->", doc, re.S)
    if not m:
        raise SystemExit("docs/architecture.md: no <!-- layering-table begin/end --> markers")
    rooms = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        room, layer = cells[0].strip("`"), cells[1]
        deps = {d.strip().strip("`") for d in cells[2].split(",") if d.strip() and d.strip() != "-"}
        if layer not in LAYERS:
            raise SystemExit(f"docs/architecture.md: room {room}: layer '{layer}' is not one of {sorted(LAYERS)}")
        rooms[room] = (layer, deps)
    return rooms


def meson_library_rooms():
    text = (ROOT / "daemon" / "meson.build").read_text(encoding="utf-8")
    m = re.search(r"feedd_lib_sources\s*=\s*files\((.*?)\)", text, re.S)
    if not m:
        raise SystemExit("daemon/meson.build: no feedd_lib_sources = files(...)")
    rooms = {s.split("/")[0] for s in re.findall(r"'([^']+)'", m.group(1))}
    if "tok" not in rooms and (ROOT / "daemon" / "tok" / "meson.build").exists():
        rooms.add("tok")  # its own static library, a dependency of feedd-lib
    return rooms


def cycles(graph):
    """Strongly connected components with more than one room (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    fatal, report = [], []
    table = read_table()
    graph, why = {}, {}
    for rel in c_files():
        src = room_of(rel)
        if src is None:
            continue
        text = (ROOT / rel).read_text(encoding="utf-8", errors="replace")
        lines = text.count("\n")
        if rel.endswith(".c") and lines > MAX_LINES:
            report.append(f"size: {rel} has {lines} lines (more than {MAX_LINES})")
        for inc in INCLUDE.findall(text):
            target = resolve(rel, inc)
            dst = room_of(target) if target else None
            if dst is None or dst == src:
                continue
            graph.setdefault(src, set()).add(dst)
            why.setdefault((src, dst), f"{rel} includes {inc}")
            if src in ("feedctl", "libfeed") and target.startswith("daemon/"):
                layer = table.get(dst, ("?",))[0]
                if layer != "library":
                    fatal.append(f"client: {rel} includes {inc}, which is outside the library's header set")
        if src not in ("feed", "server", "main", "log") and table.get(src, ("",))[0] != "policy":
            for m in LOG_CALL.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                fatal.append(f"logging: {rel}:{line} calls {m.group(0).rstrip('(').strip()} outside the policy layer")

    for src, dsts in sorted(graph.items()):
        if src not in table:
            fatal.append(f"table: room {src} includes {sorted(dsts)} but docs/architecture.md does not list it")
            continue
        layer, declared = table[src]
        for dst in sorted(dsts):
            if dst not in declared:
                fatal.append(f"table: {src} -> {dst} is not declared in docs/architecture.md ({why[(src, dst)]})")
            if layer == "library" and table.get(dst, ("?",))[0] not in ("library", "protocol"):
                fatal.append(f"library: {src} -> {dst}: the library must not depend on the daemon ({why[(src, dst)]})")
    for src, (layer, declared) in sorted(table.items()):
        for dst in sorted(declared - graph.get(src, set())):
            report.append(f"table: {src} -> {dst} is declared but no include uses it")

    lib_doc = {r for r, (layer, _) in table.items() if layer == "library"}
    lib_meson = meson_library_rooms()
    if lib_doc != lib_meson:
        fatal.append(f"library: docs/architecture.md says {sorted(lib_doc)}, daemon/meson.build builds {sorted(lib_meson)}")

    for comp in cycles({k: v for k, v in graph.items() if k not in ("feedctl", "libfeed")}):
        edges = [why[(a, b)] for a in comp for b in comp if (a, b) in why]
        report.append(f"cycle: {' <-> '.join(comp)}: " + "; ".join(edges))

    for line in report:
        print(("FAIL " if STRICT and not line.startswith("table:") else "note ") + line)
    for line in fatal:
        print("FAIL " + line)
    strict_fail = STRICT and any(not r.startswith("table:") for r in report)
    if fatal or strict_fail:
        print(f"layering: {len(fatal) + (strict_fail and sum(not r.startswith('table:') for r in report))} problem(s)")
        return 1
    print(f"layering: ok ({len(graph)} rooms, {sum(len(v) for v in graph.values())} edges"
          f"{'' if STRICT else ', report-only: cycles and file sizes (FEEDD_LAYERING_STRICT=1 makes them fatal)'})")
    return 0


def self_test():
    """A small tree with one of each violation: every check must name it."""
    import contextlib
    import io
    import tempfile
    global ROOT, STRICT
    files = {
        "docs/architecture.md": "<!-- layering-table begin -->\n| Room | Layer | Includes |\n|---|---|---|\n"
                                "| `proto` | protocol | - |\n| `lib` | library | `proto` |\n"
                                "| `a` | daemon | `b` |\n| `b` | daemon | `a` |\n| `feed` | policy | `lib` |\n"
                                "| `feedctl` | client | `lib` |\n<!-- layering-table end -->\n",
        "daemon/meson.build": "feedd_lib_sources = files(\n  'lib/lib.c',\n)\n",
        "proto/macro.h": "#pragma once\n",
        "daemon/lib/lib.h": "#pragma once\n#include \"daemon/a/a.h\"\n",
        "daemon/lib/lib.c": "#include \"daemon/lib/lib.h\"\n" + "int x;\n" * 801,
        "daemon/a/a.h": "#pragma once\n#include \"daemon/b/b.h\"\n",
        "daemon/a/a.c": "#include \"daemon/a/a.h\"\nvoid f(void) { log_info(\"x\"); }\n",
        "daemon/b/b.h": "#pragma once\n#include \"daemon/a/a.h\"\n",
        "daemon/feed/feed.h": "#pragma once\n#include \"daemon/lib/lib.h\"\n",
        "daemon/feed/feed.c": "#include \"daemon/feed/feed.h\"\nvoid g(void) { log_info(\"ok here\"); }\n",
        "client/feedctl/prep.c": "#include \"daemon/feed/feed.h\"\n",
    }
    want = [
        "FAIL library: lib -> a",                      # the library reaching into the daemon
        "FAIL table: lib -> a is not declared",        # an edge the table does not have
        "FAIL client: client/feedctl/prep.c includes daemon/feed/feed.h",
        "FAIL table: feedctl -> feed is not declared",
        "FAIL logging: daemon/a/a.c:2 calls log_info",
        "FAIL size: daemon/lib/lib.c has 802 lines",   # strict only
        "FAIL cycle: a <-> b",                         # strict only
    ]
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            (Path(d) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(d) / name).write_text(text)
        ROOT, ok = Path(d), True
        for strict in (False, True):
            STRICT = strict
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main()
            text = out.getvalue()
            for w in want:
                expect = strict or not w.startswith(("FAIL size", "FAIL cycle"))
                if expect and w not in text:
                    print(f"self-test ({'strict' if strict else 'default'}): missing '{w}' in:\n{text}")
                    ok = False
            if "logging: daemon/feed" in text:
                print("self-test: the policy layer's log call was flagged")
                ok = False
            if rc != 1:
                print(f"self-test: exit {rc}, expected 1")
                ok = False
            if not strict and "note cycle: a <-> b" not in text:
                print("self-test: the cycle is not reported without FEEDD_LAYERING_STRICT")
                ok = False
    print("layering self-test: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if sys.argv[1:]:
        ROOT = Path(sys.argv[1])
    sys.exit(main())
