# SPDX-License-Identifier: MIT
"""feedctl status and report show what the status document says about packing, mixtures and the host.

A real feedd serves a bestfit feed and a two-source pad mixture to clients that
hold their whole ring (so the counters stop moving), and the human views are
checked figure by figure against `feedctl status --json`.
"""

import os
import shutil
import time

import pytest

from conftest import feed_conf


def kill_all(ps):
    for p in ps:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


def holding(p):
    """Waits until a stream-client in HOLD mode holds every slot of its ring."""
    for line in p.stdout:
        if line.startswith("holding"):
            return
        assert not line.startswith("error"), line
    raise AssertionError(f"stream-client ended without holding its ring: {p.stderr.read()}")


@pytest.fixture
def served(daemon, dataset):
    conf = (feed_conf("bf", f"{dataset}/shard_*.idx", eos=1, extra="packing = bestfit\n") + "\n"
            "[feed.mix]\nsources = a:3, b:1\nseq_len = 256\nbatch_size = 4\neos = 1\npacking = pad\n\n"
            f"[feed.mix.a]\nshards = {dataset}/shard_*[01].idx\n\n"
            f"[feed.mix.b]\nshards = {dataset}/shard_*[23].idx\n")
    d = daemon(conf)
    ps = [d.client("bf", 0, 1, 100000, hold=True), d.client("mix", 0, 1, 100000, hold=True)]
    try:
        for p in ps:
            holding(p)
        # The host figures come with the first once-a-second sample.
        deadline = time.time() + 10
        while d.status()["telemetry"]["host"]["cpus"] == 0:
            assert time.time() < deadline, "no host sample within 10 s"
            time.sleep(0.2)
        yield d
    finally:
        kill_all(ps)


def packing_line(pk):
    return (f"packing {pk['mode']}: efficiency {100 * pk['efficiency']:.1f} %; "
            f"{pk['cut_documents']}/{pk['documents']} documents cut across rows, "
            f"{pk['truncated']} tokens truncated")


def test_status_shows_packing_mixture_shares_and_the_host(served):
    d = served
    before = d.status()
    text = d.ctl("status").stdout
    st = d.status()
    assert [f["packing"] for f in st["feeds"]] == [f["packing"] for f in before["feeds"]], \
        "the counters moved while every client held its ring"
    feeds = {f["name"]: f for f in st["feeds"]}
    bf, mix = feeds["bf"]["packing"], feeds["mix"]["packing"]
    assert bf["mode"] == "bestfit" and bf["positions"] > 0 and bf["pack_buffer"] == 64 * 256
    assert mix["mode"] == "pad" and mix["truncated"] > 0
    for pk in (bf, mix):
        assert packing_line(pk) in text, f"{packing_line(pk)!r} not in:\n{text}"
    assert [s["name"] for s in mix["sources"]] == ["a", "b"]
    for s in mix["sources"]:
        line = f"source {s['name']}: {100 * s['share']:.1f} % of documents (weight {100 * s['weight']:.1f} %)"
        assert line in text, f"{line!r} not in:\n{text}"
    assert "(weight 75.0 %)" in text and "(weight 25.0 %)" in text

    host = st["telemetry"]["host"]
    assert host["cpus"] == len(os.sched_getaffinity(d.proc.pid))
    hl = next(l for l in text.splitlines() if l.startswith("host "))
    assert hl.startswith(f"host {host['cpus']} CPUs, load ")
    assert hl.endswith(f"(host-bound from {st['telemetry']['thresholds']['host_pct']:.0f} %)")


@pytest.mark.skipif(shutil.which("gnuplot") is None, reason="gnuplot is not installed (scripts/install-deps.sh)")
def test_report_has_packing_and_mixture_tables(served, tmp_path):
    d = served
    out = tmp_path / "report"
    r = d.ctl("report", "--out", str(out))
    st = d.status()
    assert f"wrote {out}/summary.md and {len(st['clients'])} plots" in r.stderr
    for c in st["clients"]:
        png = out / f"client-{c['id']}-{c['feed']}-rank0.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    md = (out / "summary.md").read_text()
    for f in st["feeds"]:
        pk = f["packing"]
        row = (f"| {f['name']} | {pk['mode']} | {100 * pk['efficiency']:.1f} % | {pk['positions']} | "
               f"{pk['positions'] - pk['tokens']} | {pk['documents']} | {pk['cut_documents']} | {pk['truncated']} |")
        assert row in md, f"{row!r} not in:\n{md}"
    assert "### Mixture mix" in md
    for s in next(f for f in st["feeds"] if f["name"] == "mix")["packing"]["sources"]:
        row = f"| {s['name']} | {100 * s['weight']:.1f} % | {s['documents']} | {100 * s['share']:.1f} % |"
        assert row in md, f"{row!r} not in:\n{md}"
    assert f"**Host:** {st['telemetry']['host']['cpus']} CPUs, load " in md
    assert "| all workers |" in md


def test_status_answers_with_thousands_of_clients(daemon, tmp_path):
    """3,000 attached clients make a status document over 4 MiB (the old reply limit): feedctl status must still
    get it, and the daemon must not drop feedctl as a protocol violator."""
    import ctypes
    import json
    import resource
    import sys

    from conftest import BUILD, SRC, gen_megatron

    n = 3000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 5 * n + 200  # feedd holds a socket, a pidfd and ring fds per client; this process one socket each
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need} needed for {n} clients")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need) if hard == resource.RLIM_INFINITY else hard, hard))
    sys.path.insert(0, str(SRC / "client" / "python"))
    os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
    from feed import _lib

    lib = _lib.lib
    gen_megatron.main([str(tmp_path), "--shards", "1", "--docs-per-shard", "200", "--mean-len", "100", "--seed", "3"])
    d = daemon(feed_conf("web", f"{tmp_path}/shard_*.idx", seq_len=8, batch_size=1) +
               f"\n[feedd]\nmax_connections = {n + 10}\nmax_connections_per_uid = {n + 10}\nring_slots = 2\n")
    clients = []
    try:
        for i in range(n):
            c = ctypes.c_void_p()
            assert lib.feed_client_connect(d.socket.encode(), ctypes.byref(c)) == 0
            clients.append(c)
            r = lib.feed_client_attach(c, b"web", 0, 1, None)
            assert r == 0, (i, lib.feed_client_error(c))
        p = d.ctl("status", "--json", check=False)
        assert p.returncode == 0, p.stderr
        assert len(p.stdout) > 4 << 20, len(p.stdout)
        st = json.loads(p.stdout)
        assert len(st["clients"]) == n
        assert st["daemon"]["dropped"]["bad_message"] == 0
        assert all(c["telemetry"]["history"]["omitted"] == 0 for c in st["clients"] if c["telemetry"])
        assert "disconnecting" not in d.log_text()
    finally:
        for c in clients:
            lib.feed_client_close(c)


def raw_status(sock, flags):
    """One STATUS with `flags` over the wire itself (docs/protocol.md, STATUS): the reply's JSON text, or the
    ERROR's message."""
    import socket
    import struct

    def header(type_, length):
        return struct.pack("<IHHII", 0x57444546, 1, type_, length, 0)

    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock)
    try:
        s.sendall(header(1, 40) + struct.pack("<HHI32s", 1, 1, os.getpid(), b"test"))
        s.sendall(header(6, 8) + struct.pack("<II", flags, 0))

        def exact(n):
            buf = bytearray()
            while len(buf) < n:
                got = s.recv(min(n - len(buf), 1 << 20))
                assert got, "feedd closed the connection"
                buf += got
            return bytes(buf)

        for want in (2, 7):  # HELLO_REPLY, STATUS_REPLY
            _, _, typ, length, _ = struct.unpack("<IHHII", exact(16))
            body = exact(length)
            why = body[8:].split(b"\0")[0]
            assert typ == want, f"reply type {typ}, expected {want}: {why!r}"
        return body.decode()
    finally:
        s.close()


def test_status_leaves_out_what_is_asked_and_the_history_stays_available(daemon, dataset):
    """feedctl status asks for no per-client history (nor since_attach): its reply must stay the same size
    while every client's history grows, and the whole document, history included, must still come to whoever
    asks for it: an old client's request (flags 0), feedctl status --json, and a request with a flag this
    daemon does not know."""
    import json

    n = 12
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx"))
    ps = [d.client("web", r, n, 100000, hold=True) for r in range(n)]
    try:
        for p in ps:
            holding(p)

        def histories(doc):
            return [len(c["telemetry"]["history"]["batches"]) for c in doc["clients"] if c["telemetry"]]

        deadline = time.time() + 20
        while len(histories(json.loads(raw_status(d.socket, 0)))) < n or \
                min(histories(json.loads(raw_status(d.socket, 0)))) < 2:
            assert time.time() < deadline, "the clients' history did not grow to 2 samples in 20 s"
            time.sleep(0.2)
        brief, whole = [raw_status(d.socket, 3)], [raw_status(d.socket, 0)]
        time.sleep(4)
        brief.append(raw_status(d.socket, 3))
        whole.append(raw_status(d.socket, 0))
        grew = min(histories(json.loads(whole[1]))) - min(histories(json.loads(whole[0])))
        assert grew >= 3, f"history grew by {grew} samples in 4 s"
        # Each sample is 7 numbers: the whole document's histories grew with them (measured on the histories:
        # the rest of the document's reals change length from one reply to the next, by hundreds of bytes under
        # ASan, where the clients are slow), and the brief document stayed the same size.
        def history_bytes(doc):
            return len(json.dumps([c["telemetry"]["history"] for c in json.loads(doc)["clients"] if c["telemetry"]]))
        assert history_bytes(whole[1]) - history_bytes(whole[0]) >= n * grew * 7 * 2, \
            (history_bytes(whole[0]), history_bytes(whole[1]))
        assert abs(len(brief[1]) - len(brief[0])) <= 0.02 * len(brief[0]), (len(brief[0]), len(brief[1]))
        assert len(brief[1]) < len(whole[1]), (len(brief[1]), len(whole[1]))

        b, w = json.loads(brief[1]), json.loads(whole[1])
        assert len(b["clients"]) == len(w["clients"]) == n
        for bc, wc in zip(b["clients"], w["clients"]):
            assert bc["id"] == wc["id"]
            assert set(bc) == set(wc), set(bc) ^ set(wc)
            assert set(bc["telemetry"]) == set(wc["telemetry"]) - {"history", "since_attach"}, bc["telemetry"].keys()
            assert bc["telemetry"]["window"].keys() == wc["telemetry"]["window"].keys()
        assert b.keys() == w.keys() and b["feeds"][0].keys() == w["feeds"][0].keys()

        # feedctl: the table (what it prints is in the brief document), --json whole, --json --brief not.
        table = d.ctl("status").stdout
        ids = {int(line.split()[0]) for line in table.splitlines() if line.split() and line.split()[0].isdigit()}
        assert ids == {c["id"] for c in b["clients"]}, table
        assert all(c["telemetry"]["history"]["batches"] for c in d.status()["clients"])
        cut = json.loads(d.ctl("status", "--json", "--brief").stdout)
        assert len(cut["clients"]) == n and not any("history" in c["telemetry"] for c in cut["clients"])

        # A bit this daemon does not know is ignored: the whole document, the connection not dropped.
        other = json.loads(raw_status(d.socket, 1 << 31))
        assert all(c["telemetry"]["history"]["batches"] and "since_attach" in c["telemetry"] for c in other["clients"])
        assert other["daemon"]["protocol_errors"] == 0
    finally:
        kill_all(ps)


def test_operators_have_a_socket_of_their_own(dataset):
    """Beside the control socket feedd binds an operator socket only root and its own user can reach (0600):
    feedctl status, reload and drain go through it when they can, so an operator's connection is never queued
    behind the clients' (or a flood's) in the control socket's backlog, and fall back to the control socket
    otherwise. It is removed at exit."""
    import json
    import stat
    import subprocess
    import tempfile

    from conftest import FEEDCTL, Daemon

    if os.geteuid() != 0:
        pytest.skip("needs root: the operator socket is checked against an ordinary user (setpriv)")
    top = tempfile.mkdtemp(dir="/tmp", prefix="feedd-op-")  # one others may traverse: nobody reaches the socket
    os.chmod(top, 0o755)
    d = Daemon(top, feed_conf("web", f"{dataset}/shard_*.idx") + "\n[feedd]\nsocket_mode = 0666\n")
    try:
        op = os.path.join(top, "feedd-operator.sock")
        st = os.stat(op)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), st
        assert f"operators (root, feedd's user) have {op}" in d.log_text()

        # Root reaches feedd through it: with the control socket's name moved away, status still answers.
        moved = d.socket + ".moved"
        os.rename(d.socket, moved)
        try:
            p = d.ctl("status", "--json", check=False)
            assert p.returncode == 0, p.stderr
            assert json.loads(p.stdout)["daemon"]["socket"] == d.socket
        finally:
            os.rename(moved, d.socket)

        # Another user cannot connect to it, and falls back to the control socket.
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        r = subprocess.run(nobody + ["/usr/bin/python3", "-c",
                                     "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
                                     "try:\n s.connect(sys.argv[1])\nexcept PermissionError:\n sys.exit(13)\n",
                                     op], capture_output=True, text=True)
        assert r.returncode == 13, (r.returncode, r.stderr)
        r = subprocess.run(nobody + [str(FEEDCTL), "--socket", d.socket, "status"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("feedd "), r.stderr
    finally:
        assert d.stop() == 0, d.log_text()
    assert not os.path.exists(op), "the operator socket outlived feedd"
    import shutil as sh
    sh.rmtree(top, ignore_errors=True)
