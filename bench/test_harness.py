# SPDX-License-Identifier: MIT
"""Checks that the benchmark harness measures what it says (meson suite 'bench').

Runs with Debian's /usr/bin/python3 -m pytest; FEEDD_BUILD_DIR names the
build. Small data, no timing asserted: the drivers must read every byte
they claim to, the scaling client must get its rank's batches from a real
feedd, and the report must replace only its own part of the doc.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

BUILD = Path(os.environ.get("FEEDD_BUILD_DIR", common.SRC / "build")).resolve()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    common.gen_megatron.main([str(d), "--shards", "3", "--docs-per-shard", "500", "--mean-len", "300",
                              "--seed", "7"])
    return d


def io(*args):
    out = subprocess.run([str(BUILD / "bench/io"), *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_io_driver_reads_every_byte_of_the_shards(shards):
    bins = sorted(str(p) for p in shards.glob("*.bin"))
    idx = sorted(str(p) for p in shards.glob("*.idx"))
    total = sum(os.path.getsize(p) for p in bins)
    for order in ("seq", "shuffle"):
        r = io("docs", order, 1, 4096, 8, *idx)
        assert r["bytes"] == total, order
        assert r["reads"] == 1500, order  # one read per document, as a worker does
        assert r["engine"] == "io_uring"
    r = io("chunks", 1, 4, *bins)
    assert r["bytes"] == total


def test_io_driver_reads_small_files_one_by_one(tmp_path):
    paths = []
    for i in range(20):
        p = tmp_path / f"{i}.bin"
        p.write_bytes(bytes(range(256)) * (i + 1))
        paths.append(str(p))
    (tmp_path / "list").write_text("\n".join(paths) + "\n")
    r = io("files", tmp_path / "list")
    assert r["reads"] == 20
    assert r["bytes"] == 256 * sum(range(1, 21))


def test_io_driver_names_a_missing_file(tmp_path):
    (tmp_path / "list").write_text(f"{tmp_path}/nope.bin\n")
    p = subprocess.run([str(BUILD / "bench/io"), "files", str(tmp_path / "list")], capture_output=True, text=True)
    assert p.returncode == 1
    assert "nope.bin" in p.stderr


def test_cold_cache_leaves_no_page_resident(shards):
    bins = sorted(str(p) for p in shards.glob("*.bin"))
    common.warm(bins)
    how = common.make_cold(bins)
    if common.resident_bytes(bins) is None:
        pytest.skip("no fincore to check with")
    assert common.resident_bytes(bins) == 0, how


def test_scaling_clients_get_their_ranks_batches(shards, tmp_path):
    conf = f"[feed.b]\nshards = {shards}/*.idx\nseq_len = 64\nbatch_size = 2\n"
    d, sock = common.start_feedd(BUILD, conf, tmp_path)
    try:
        procs = [subprocess.Popen([str(BUILD / "bench/scaling"), sock, "b", str(r), "2", "5"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(2)]
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        outs = []
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            outs.append(json.loads(p.stdout.readline()))
            assert p.wait() == 0
        assert d.poll() is None
        mem = common.proc_mem(d.pid)
        assert mem["VmRSS"] > 0
        assert common.proc_cpu(d.pid) >= 0
    finally:
        common.stop(d)
    assert sorted(o["rank"] for o in outs) == [0, 1]
    assert all(o["tokens"] == 5 * 2 * 64 for o in outs)


def test_report_rewrites_only_its_part_of_the_doc(tmp_path):
    res = tmp_path / "results"
    res.mkdir()
    (res / "io.json").write_text(json.dumps({
        "experiment": "io", "title": "1. Reads", "command": "bench/io/run.py", "machine": "m", "date": "2026-11-21",
        "data": "d", "cache": "cold", "notes": ["n1"],
        "tables": [{"caption": "c", "columns": ["reader", "MB/s", "/ fio"], "rows": [["fio", 1000.0, "1.00x"],
                                                                                   ["feedd", 950.0, "0.95x"]]}],
        "plot": {"kind": "barh", "xlabel": "MB/s", "labels": ["fio", "feedd"], "values": [1000.0, 950.0]}}))
    (res / "padding.status").write_text("not available yet: bench/padding/ does not exist in this tree\n")
    doc = tmp_path / "b.md"
    report = __import__("report")
    doc.write_text(f"# Title\n\nkept above\n\n{report.BEGIN}\nold figures\n{report.END}\n\nkept below\n")
    subprocess.run(["/usr/bin/python3", str(HERE / "report.py"), str(res), "--doc", str(doc), "--plots",
                    str(tmp_path / "img")], check=True, capture_output=True)
    text = doc.read_text()
    assert "kept above" in text and "kept below" in text and "old figures" not in text
    assert "| feedd | 950 | 0.95x |" in text
    assert "Not available yet: bench/padding/ does not exist in this tree." in text
    assert "Not measured in this run" in text  # parallel, e2e, scaling: no results
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "img" / "io.png").stat().st_size > 1000
    assert "](img/io.png)" in text


def test_run_sh_refuses_unknown_options():
    p = subprocess.run(["sh", str(HERE / "run.sh"), "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "--bogus" in p.stderr


def test_every_experiment_folder_is_in_the_registry_and_back():
    """run.sh runs what common.EXPERIMENTS lists: a folder bench/NAME/ not listed would never run."""
    names = {e[0] for e in common.EXPERIMENTS}
    folders = {p.name for p in HERE.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert folders == names, (folders - names, names - folders)
    for name, kind, _, _ in common.EXPERIMENTS:
        driver = HERE / name / "run.py"
        assert kind in ("json", "text", "print", "tok"), (name, kind)
        assert kind in ("text", "tok") or driver.exists(), f"{name}: {driver} is missing"
    listed = subprocess.run(["/usr/bin/python3", str(HERE / "common.py"), "--list"], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    assert [line.split()[0] for line in listed if line] == [e[0] for e in common.EXPERIMENTS]
