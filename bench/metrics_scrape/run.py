#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What a Prometheus scrape costs, and whether scraping disturbs serving
(docs/configuration.md, metrics_listen).

1. Cost: feedd with N attached clients (each holding a full ring, so the
   numbers are stable), GET /metrics over one keep-alive HTTP connection
   back to back; the peer is the status document (STATUS over one control
   connection through libfeed's feed_client_status), which is made of the
   same snapshot. Reports the round trip of each and the daemon's own
   snapshot-and-render time (feedd_metrics_scrape_duration_seconds).
2. Disturbance: bench/consume taking batches back to back from a 1-thread
   feedd, while another process scrapes /metrics back to back (far more often
   than any Prometheus would), against the same without scraping (the peer),
   in alternating runs; and with a scraper every 100 ms.

Usage: metrics_scrape.py [--build DIR] [--out result.json] [--rounds N]
"""

import argparse
import ctypes
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402


def metrics_endpoint(lib, sock):
    doc = status_once(lib, sock)
    host, port = doc["daemon"]["metrics"]["listen"].rsplit(":", 1)
    return host, int(port)


def status_once(lib, sock):
    c = ctypes.c_void_p()
    assert lib.feed_client_connect(sock.encode(), ctypes.byref(c)) == 0
    out = ctypes.c_void_p()
    assert lib.feed_client_status(c, ctypes.byref(out)) == 0
    doc = json.loads(ctypes.string_at(out.value).decode())
    libc.free(out)
    lib.feed_client_close(c)
    return doc


def time_status(lib, sock, n):
    """Microseconds per STATUS round trip on one connection."""
    c = ctypes.c_void_p()
    assert lib.feed_client_connect(sock.encode(), ctypes.byref(c)) == 0
    out = ctypes.c_void_p()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert lib.feed_client_status(c, ctypes.byref(out)) == 0
        times.append((time.perf_counter() - t0) * 1e6)
        libc.free(out)
    lib.feed_client_close(c)
    return statistics.median(times)


def time_scrape(host, port, n):
    """(us per GET /metrics round trip, median daemon-side us, bytes) on one keep-alive connection."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    times, inside, size = [], [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        body = conn.getresponse().read()
        times.append((time.perf_counter() - t0) * 1e6)
        size = len(body)
        for line in body.split(b"\n"):
            if line.startswith(b"feedd_metrics_scrape_duration_seconds "):
                inside.append(float(line.split()[1]) * 1e6)
    conn.close()
    return statistics.median(times), statistics.median(inside[1:]), size


def hold_clients(build, sock, n):
    procs = []
    for i in range(n):
        p = subprocess.Popen([str(Path(build) / "tests/integration/stream-client"), sock, "web", str(i), str(n),
                              str(10**9), "-", "0", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(p)
    for p in procs:
        for line in p.stdout:
            if line.startswith("holding"):
                break
    return procs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.SRC / "build"))
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--batches", type=int, default=3000)
    a = ap.parse_args()
    global libc
    libc = ctypes.CDLL("libc.so.6")
    lib = ctypes.CDLL(str(Path(a.build) / "client/libfeed.so.0"))
    lib.feed_client_connect.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.feed_client_status.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.feed_client_close.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]

    tmp = Path(tempfile.mkdtemp(prefix="feedd-metrics-bench-"))
    data = tmp / "data"
    common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                              "--seed", "3"])
    B, L = 8, 2048

    # 1. cost per scrape with N clients
    cost_rows = []
    for n in (0, 8, 64):
        conf = (f"[feedd]\nthreads = 2\nmetrics_listen = 127.0.0.1:0\nmax_connections_per_uid = 256\n\n"
                f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = 256\nbatch_size = 2\n")
        p, sock = common.start_feedd(a.build, conf, tmp, f"cost{n}")
        clients = []
        try:
            clients = hold_clients(a.build, sock, n)
            host, port = metrics_endpoint(lib, sock)
            scrape, inside, size = [], [], 0
            status = []
            for _ in range(a.rounds):
                s, i, size = time_scrape(host, port, a.requests)
                scrape.append(s)
                inside.append(i)
                status.append(time_status(lib, sock, a.requests))
            s, i, st = statistics.median(scrape), statistics.median(inside), statistics.median(status)
            common.progress(f"{n} clients: scrape {s:.0f} us (inside feedd {i:.0f} us, {size} bytes), status {st:.0f} us")
            cost_rows.append([n, s, common.ratio(s, st), i, size, st, common.ratio(st, st)])
        finally:
            for c in clients:
                c.kill()
                c.wait()
            common.stop(p)

    # 2. serving with and without a scraper hammering the endpoint
    modes = {"back-to-back": 0.0, "every 100 ms": 0.1, "none": None}
    tps = {m: [] for m in modes}
    for r in range(a.rounds):
        for mode, period in modes.items():
            scraping = period is not None
            conf = (f"[feedd]\nthreads = 1\nmetrics_listen = 127.0.0.1:0\n\n"
                    f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = {L}\nbatch_size = {B}\n")
            p, sock = common.start_feedd(a.build, conf, tmp, f"load{r}{mode[:4]}")
            stop = threading.Event()
            scrapes = [0]

            def hammer(host, port):
                conn = http.client.HTTPConnection(host, port, timeout=10)
                while not stop.is_set():
                    conn.request("GET", "/metrics")
                    conn.getresponse().read()
                    scrapes[0] += 1
                    if period:
                        stop.wait(period)
                conn.close()
            try:
                host, port = metrics_endpoint(lib, sock)
                t = threading.Thread(target=hammer, args=(host, port)) if scraping else None
                if t:
                    t.start()
                t0 = time.perf_counter()
                out = subprocess.run([str(Path(a.build) / "bench/consume"), sock, "web", str(a.batches), "0", "0"],
                                     capture_output=True, text=True, check=True).stdout
                dt = time.perf_counter() - t0
            finally:
                stop.set()
                if scraping:
                    t.join()
                common.stop(p)
            tps[mode].append(json.loads(out)["tokens_per_s"])
            common.progress(f"round {r}: scraper {mode}: {tps[mode][-1] / 1e6:.1f} M tokens/s"
                            + (f", {scrapes[0] / dt:.0f} scrapes/s" if scraping else ""))
    med = {m: statistics.median(v) for m, v in tps.items()}
    res = {
        "title": "Metrics endpoint: the cost of a scrape, and serving while scraped",
        "command": "bench/metrics_scrape/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(),
        "date": common.date(),
        "data": f"4 Megatron u16 shards, ~1.2 M tokens; cost: batches of 2x256, clients holding full rings; "
                f"load: batches of {B}x{L}, 1 worker thread, {a.batches} batches a run",
        "cache": "warm (page cache)",
        "tables": [{
            "caption": f"cost per request, median of {a.rounds} x {a.requests} back-to-back requests on one connection",
            "columns": ["clients attached", "GET /metrics us", "ratio vs status", "inside feedd us", "bytes",
                        "STATUS (peer) us", "ratio"],
            "rows": cost_rows,
        }, {
            "caption": f"bench/consume tokens/s, median of {a.rounds} alternating runs each",
            "columns": ["scraper", "tokens/s", "ratio vs none"],
            "rows": [[m if m != "none" else "none (peer)", med[m], common.ratio(med[m], med["none"])] for m in modes],
        }],
        "notes": ["round trips are measured in Python (http.client; libfeed through ctypes), so they include the "
                  "client's own time; 'inside feedd' is the daemon's snapshot and render time",
                  "the host has 2 cores shared by feedd, the consumer and the scraper: the load table shows the "
                  "worst case of a scraper competing for CPU, not a Prometheus scraping every 15 s",
                  "all runs, M tokens/s: " + "; ".join(f"{m}: {[round(x / 1e6, 1) for x in v]}" for m, v in tps.items())],
    }
    common.emit(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
