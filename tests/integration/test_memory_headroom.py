# SPDX-License-Identifier: MIT
"""An attach in a memory cgroup whose usage is mostly page cache (issue #22's 1 B-document corpus).

feedd refuses an attach whose ring would not fit in what its memory cgroup
has left (server/headroom.c). A Megatron feed maps its .idx files, and the
index scan reads them all: at 1 B documents that is ~20 GB of page cache,
charged to feedd's group. The kernel reclaims that cache before the group's
OOM killer runs, so it is room, not use: measured with bench/scale at 1 B
documents under a 6 GiB group, every attach after the scan was refused
("6142 MiB in use"). Here, at a size a test can write: a group of 128 MiB,
an index of 256 MiB read by feedd's scan inside it.

Needs root and a cgroup-v1 memory controller (exits 77 and says so without).
"""

import os
import time
from pathlib import Path

import pytest

import conftest
from conftest import RSS_IS_FEEDDS, RSS_SKIP_REASON, Daemon, feed_conf, remove_cgroup, write_sparse_shard

MEMCG = Path("/sys/fs/cgroup/memory")
LIMIT = 128 << 20
TOKENS_PER_DOC = 8


@pytest.fixture
def memcg(tmp_path):
    """A cgroup-v1 memory group of LIMIT bytes, the OOM killer left on (as on a node); removed after."""
    if os.geteuid() != 0 or not (MEMCG / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and a cgroup-v1 memory controller to put feedd in a memory cgroup")
    if not RSS_IS_FEEDDS:
        pytest.skip(RSS_SKIP_REASON)
    cg = MEMCG / f"feedd-test-{os.getpid()}-{tmp_path.name}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(LIMIT))
    except OSError as e:
        pytest.skip(f"cannot set up a memory cgroup: {e}")
    yield cg
    remove_cgroup(cg)


def test_page_cache_of_the_mapped_index_does_not_refuse_attaches(memcg, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):  # 2 x 6.4 M documents: 2 x 128 MiB of .idx, twice the group's limit
        write_sparse_shard(data / f"s{i}", 6_400_000, TOKENS_PER_DOC, uncached=True)
    # feedd joins the group before exec, so that its index scan's reads are charged to it.
    monkeypatch.setattr(conftest, "DAEMON_WRAPPER",
                        ["sh", "-c", f'echo $$ > {memcg}/cgroup.procs && exec "$@"', "sh"] + conftest.DAEMON_WRAPPER)
    small = feed_conf("small", f"{data}/s*.idx", seq_len=256, batch_size=4)
    # 4 slots of 64 x 65536 tokens: a ring of ~256 MiB, twice the group's limit.
    big = feed_conf("big", f"{data}/s*.idx", seq_len=65536, batch_size=64)
    d = Daemon(tmp_path, "[feedd]\nring_slots = 4\n" + small + "\n" + big)
    try:
        assert str(d.proc.pid) in (memcg / "cgroup.procs").read_text().split()
        deadline = time.time() + 60 * conftest.TIME_SCALE
        while "small: index validated" not in d.log_text() or "big: index validated" not in d.log_text():
            assert d.proc.poll() is None, f"feedd died ({d.proc.returncode}):\n{d.log_text()}"
            assert time.time() < deadline, d.log_text()
            time.sleep(0.1)
        usage = int((memcg / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (memcg / "memory.stat").read_text().splitlines())
        cache = int(stat["total_active_file"]) + int(stat["total_inactive_file"])
        # The precondition: the group is full, mostly of the index's page cache (a ring and the 32 MiB slack
        # would not fit in limit - usage).
        assert LIMIT - usage < 40 << 20 and cache > 64 << 20, (usage, cache)

        got = d.dump("small", tmp_path / "small", batches=3)
        assert got["input_ids"].shape == (3, 4, 256)
        assert d.proc.poll() is None

        # What the page cache cannot make room for is still refused, and feedd is not OOM-killed.
        p = d.dump("big", tmp_path / "big", batches=1, check=False)
        assert p.returncode != 0
        assert "out of memory" in p.stderr.lower() and "memory cgroup" in p.stderr, p.stderr
        assert d.proc.poll() is None, f"feedd died ({d.proc.returncode}): OOM-killed?"
    finally:
        assert d.stop() == 0, d.log_text()
