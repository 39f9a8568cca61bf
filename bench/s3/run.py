#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Object storage (issue #24): a feed over s3:// from a local S3 server.

Runs with Debian's /usr/bin/python3 (python3-boto3 for the peer). The server
is s3rver (npm, scripts/fetch-s3-tools.sh) on 127.0.0.1; the data a Megatron
dataset (scripts/gen_megatron.py, u16) uploaded to it.

  throughput: the bytes of every object fetched, in MB/s:
      feedd  a real feedd (s3_max_requests = C) serving one epoch of a feed
             over s3:// to bench/consume (B = 8, L = 2048, shuffled), from a
             fresh start (nothing cached: no cache_dir);
      boto3  Debian's python3-boto3 downloading the same objects, C objects
             at a time (get_object, the whole body), the way a MosaicML- or
             LitData-style loader does before it reads;
      boto3, then feedd  the download followed by the same feed over the
             downloaded files: what a download-first loader pays per epoch;
      local  the same feed over the same files on local disk (page cache
             warm), as the ceiling.
  On a small machine the sides share its CPUs with the server (node): feedd
  serves an epoch while it fetches, boto3 only downloads.
  requests: the object GETs and bytes the store sees for one epoch of a
      world of 8 ranks (all ranks to the end of an epoch): one feedd serving
      the 8 ranks (one fetcher per node), against 8 feedd processes each
      serving one rank (8 independent readers, each rank fetching alone), as
      counted by the tests' proxy (tests/s3/s3proxy.mjs).

  bench/s3/run.py [--build build] [--rounds 2] [--full] [--json out.json] [--note TEXT]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

B, L = 8, 2048
C = 16  # requests in flight, both sides
TOOLS = Path(os.environ.get("FEEDD_S3TOOLS") or common.SRC / "build" / "s3tools")
# s3rver's own key pair: it refuses other access keys, even where it does not check signatures.
KEY, SECRET = "S3RVER", "S3RVER"


class Store:
    def __init__(self, tmp):
        self.p = subprocess.Popen(["node", str(common.SRC / "tests/s3/s3proxy.mjs"), str(TOOLS), str(tmp / "s3data"),
                                   "--access-key", KEY, "--secret-key", SECRET],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ports = json.loads(self.p.stdout.readline())
        self.direct = f"http://127.0.0.1:{ports['s3rver']}"
        self.proxy = f"http://127.0.0.1:{ports['proxy']}"

    def put(self, key, path):
        req = urllib.request.Request(f"{self.direct}/feedd/{key}", data=Path(path).read_bytes(), method="PUT")
        urllib.request.urlopen(req).read()

    def stats(self):
        return json.loads(urllib.request.urlopen(self.proxy + "/__proxy/stats").read())

    def stop(self):
        self.p.terminate()
        self.p.wait()


def feed_conf(shards, endpoint=None, extra=""):
    head = "[feedd]\nthreads = 2\nring_slots = 8\n" + extra
    if endpoint:
        head += f"s3_endpoint = {endpoint}\ns3_path_style = true\ns3_max_requests = {C}\n"
    return head + (f"[feed.t]\nshards = {shards}\nseq_len = {L}\nbatch_size = {B}\nseed = 1\nshuffle = true\n"
                   f"shuffle_window = 4\n")


def epoch_batches(tokens):
    return max(1, int(0.95 * tokens / (B * L)))


def serve(build, tmp, conf, batches, name):
    p, sock = common.start_feedd(build, conf, tmp, name)
    try:
        t0 = time.monotonic()
        r = common.consume(build, sock, "t", batches, daemon=p)
        secs = time.monotonic() - t0
        st = json.loads(subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "--socket", sock, "status",
                                        "--json"], capture_output=True, text=True, check=True).stdout)
    finally:
        common.stop(p)
    return secs, r, st.get("fetch", {})


def boto3_fetch(endpoint, keys):
    import boto3
    from botocore.config import Config
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                      region_name="us-east-1",
                      config=Config(max_pool_connections=C, s3={"addressing_style": "path"}))
    t0 = time.monotonic()
    with ThreadPoolExecutor(C) as ex:
        total = sum(ex.map(lambda k: len(s3.get_object(Bucket="feedd", Key=k)["Body"].read()), keys))
    return time.monotonic() - t0, total


def main():
    a = common.arg_parser().parse_args()
    if not shutil.which("node") or not (TOOLS / "node_modules" / "s3rver").exists():
        sys.exit("bench/s3: needs node and scripts/fetch-s3-tools.sh")
    tmp = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    # Both sides sign (SigV4) with the same keys; feedd takes them from the environment.
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    n_docs = 8000 if a.full else 2500
    common.gen_megatron.main([str(tmp / "data"), "--shards", "8", "--docs-per-shard", str(n_docs), "--mean-len",
                              "1000", "--seed", "1"])
    files = sorted((tmp / "data").iterdir())
    size = sum(f.stat().st_size for f in files)
    tokens = sum(f.stat().st_size for f in files if f.suffix == ".bin") // 2
    batches = epoch_batches(tokens)
    keys = [f"meg/{f.name}" for f in files]

    rows = {"feedd s3://": [], "boto3 get_object": [], "boto3, then feedd on the files": [],
            "feedd local files": []}
    fetched = {}
    for rnd in range(a.rounds):
        common.progress(f"s3 round {rnd + 1}: throughput")
        store = Store(tmp / f"r{rnd}")
        for f in files:
            store.put(f"meg/{f.name}", f)
        secs, r, fetch = serve(a.build, tmp, feed_conf("s3://feedd/meg/*.idx", store.direct), batches, f"s3-{rnd}")
        fetched = fetch
        rows["feedd s3://"].append(fetch.get("bytes", 0) / 1e6 / secs)
        bsecs, total = boto3_fetch(store.direct, keys)
        rows["boto3 get_object"].append(total / 1e6 / bsecs)
        common.warm([str(f) for f in files])
        lsecs, _, _ = serve(a.build, tmp, feed_conf(f"{tmp / 'data'}/*.idx"), batches, f"local-{rnd}")
        rows["feedd local files"].append(size / 1e6 / lsecs)
        # What a download-first loader (MosaicML Streaming style) pays before the same epoch.
        rows["boto3, then feedd on the files"].append(size / 1e6 / (bsecs + lsecs))
        store.stop()
    peer = max(rows["boto3 get_object"])
    tput = [[k, max(v), common.ratio(max(v), peer)] for k, v in rows.items()]

    # Requests per node: 8 ranks in one feedd against 8 feedds of one rank each.
    common.progress("s3: requests, 8 ranks")
    req_rows = []
    per_rank = max(1, batches // 8)
    for label, daemons in (("one feedd, 8 ranks", 1), ("8 independent readers", 8)):
        store = Store(tmp / f"req-{daemons}")
        for f in files:
            store.put(f"meg/{f.name}", f)
        procs = []
        try:
            for i in range(daemons):
                procs.append(common.start_feedd(a.build, feed_conf("s3://feedd/meg/*.idx", store.proxy), tmp,
                                                f"req{daemons}-{i}"))
            env = os.environ
            clients = [subprocess.Popen([str(Path(a.build) / "tests/integration/stream-client"),
                                         procs[rank % daemons][1], "t", str(rank), "8", str(per_rank)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
                       for rank in range(8)]
            for c in clients:
                if c.wait(600) != 0:
                    raise RuntimeError(c.stderr.read().decode())
            st = store.stats()
        finally:
            for p, _ in procs:
                common.stop(p)
            store.stop()
        req_rows.append([label, st["gets"], st["gets"] + st["heads"] + st["lists"], st["connections"],
                         st["bytes"] / 1e6, st["bytes"] / size])
    res = {
        "title": "Object storage: a feed over s3:// from a local S3 server",
        "command": "bench/s3/run.py" + (" --full" if a.full else ""),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": f"Megatron u16, 8 shards, {size / 1e6:.0f} MB (.idx + .bin), {tokens / 1e6:.1f} M tokens; "
                f"s3rver 3.7.1 on 127.0.0.1 (node), path-style, SigV4-signed; B = {B}, L = {L}, shuffled, "
                f"{batches} batches (95 % of an epoch)",
        "cache": "feedd: fresh process, no cache_dir (every byte fetched); local: page cache warm",
        "tables": [
            {"caption": f"Throughput, MB/s of object bytes (best of {a.rounds}); {C} requests in flight on both sides",
             "columns": ["reader", "MB/s", "/ boto3"], "rows": tput},
            {"caption": f"Requests the store sees: 8 ranks (world 8) reading {per_rank} batches each",
             "columns": ["readers", "object GETs", "all requests", "TCP connections", "MB fetched", "x data size"],
             "rows": req_rows},
        ],
        "notes": [f"feedd's fetcher at the end of its last throughput run: {json.dumps(fetched)}"],
    }
    common.emit(res, a.json)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
