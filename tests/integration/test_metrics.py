# SPDX-License-Identifier: MIT
"""The Prometheus endpoint (metrics_listen): a real feedd, real clients, real
HTTP. The exposition text is read by a strict parser written here from the
text format's specification (version 0.0.4), which also checks Prometheus'
naming conventions; its numbers must equal the status document's, and its
counters must grow while a client consumes.

Runs with Debian's /usr/bin/python3; see conftest.py.
"""

import http.client
import math
import os
import re
import socket
import subprocess
import time

import pytest

from conftest import FEEDD, TIME_SCALE, feed_conf, gen_megatron, open_fds

# ---------------------------------------------------------------------------
# A strict reader of the text exposition format 0.0.4
# (https://prometheus.io/docs/instrumenting/exposition_formats/).

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class FormatError(AssertionError):
    pass


def parse_value(text, where):
    if text in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(text.replace("Inf", "inf"))
    # Go's ParseFloat, minus what Prometheus never writes (hex floats, underscores).
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        raise FormatError(f"{where}: '{text}' is not a float")
    return float(text)


def parse_labels(text, pos, where):
    """Parses '{a="x",b="y"}' starting at text[pos] == '{'. Returns (labels, position after '}')."""
    labels = {}
    pos += 1
    while True:
        if text[pos] == "}":
            return labels, pos + 1
        m = LABEL_NAME.match(text, pos)
        if not m:
            raise FormatError(f"{where}: a label name expected at column {pos}")
        name = m.group(0)
        pos = m.end()
        if text[pos:pos + 2] != '="':
            raise FormatError(f"{where}: '=\"' expected after label {name}")
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise FormatError(f"{where}: label {name}'s value is not closed")
            ch = text[pos]
            if ch == "\\":
                esc = text[pos + 1:pos + 2]
                if esc not in ("\\", '"', "n"):
                    raise FormatError(f"{where}: label {name}: '\\{esc}' is not an escape of the format")
                value.append("\n" if esc == "n" else esc)
                pos += 2
            elif ch == '"':
                pos += 1
                break
            elif ch == "\n":
                raise FormatError(f"{where}: label {name}: raw newline in a value")
            else:
                value.append(ch)
                pos += 1
        if name in labels:
            raise FormatError(f"{where}: label {name} given twice")
        labels[name] = "".join(value)
        if text[pos] == ",":
            pos += 1
        elif text[pos] != "}":
            raise FormatError(f"{where}: ',' or '}}' expected after label {name}")


class Family:
    def __init__(self, name):
        self.name, self.type, self.help, self.samples = name, None, None, []

    def values(self, suffix="", **match):
        """{frozenset of labels: value} of the samples named name+suffix whose labels include match."""
        want = self.name + suffix
        return {frozenset(l.items()): v for n, l, v in self.samples
                if n == want and all(l.get(k) == str(x) for k, x in match.items())}

    def value(self, suffix="", **match):
        vals = self.values(suffix, **match)
        if len(vals) != 1:
            raise AssertionError(f"{self.name}{suffix} {match}: {len(vals)} samples")
        return next(iter(vals.values()))


def parse_exposition(text):
    """Returns {family name: Family}, or raises FormatError naming the line."""
    if text and not text.endswith("\n"):
        raise FormatError("the text does not end with a newline")
    families, order, seen_series = {}, [], set()
    current = None

    def family_of(sample_name):
        for fam in (current, families.get(sample_name)):
            if fam is None:
                continue
            suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}.get(fam.type, ())
            if sample_name == fam.name or any(sample_name == fam.name + s for s in suffixes):
                return fam
        return None

    for no, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {no}"
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.fullmatch(name):
                    raise FormatError(f"{where}: '{name}' is not a metric name")
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = Family(name)
                    order.append(name)
                elif fam is not current:
                    raise FormatError(f"{where}: {parts[1]} of {name}, whose samples are not contiguous")
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    if fam.help is not None:
                        raise FormatError(f"{where}: a second HELP for {name}")
                    if re.search(r"\\[^\\n]", rest):
                        raise FormatError(f"{where}: HELP of {name} has an escape other than \\\\ and \\n")
                    fam.help = rest
                else:
                    if fam.type is not None:
                        raise FormatError(f"{where}: a second TYPE for {name}")
                    if fam.samples:
                        raise FormatError(f"{where}: TYPE of {name} after its samples")
                    if rest not in TYPES:
                        raise FormatError(f"{where}: '{rest}' is not a metric type")
                    fam.type = rest
                current = fam
            continue
        m = METRIC_NAME.match(line)
        if not m:
            raise FormatError(f"{where}: a metric name expected")
        name, pos, labels = m.group(0), m.end(), {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = parse_labels(line, pos, where)
        if pos >= len(line) or line[pos] != " ":
            raise FormatError(f"{where}: a space expected before the value")
        fields = line[pos + 1:].split(" ")
        if not 1 <= len(fields) <= 2:
            raise FormatError(f"{where}: value [timestamp] expected, got '{line[pos + 1:]}'")
        value = parse_value(fields[0], where)
        if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
            raise FormatError(f"{where}: '{fields[1]}' is not a timestamp in milliseconds")
        fam = family_of(name)
        if fam is None:
            if name in families:
                raise FormatError(f"{where}: samples of {name} are not contiguous")
            fam = families[name] = Family(name)
            order.append(name)
        elif fam is not current:
            raise FormatError(f"{where}: samples of {fam.name} are not contiguous")
        current = fam
        series = (name, frozenset(labels.items()))
        if series in seen_series:
            raise FormatError(f"{where}: the series {name}{labels} appears twice")
        seen_series.add(series)
        fam.samples.append((name, labels, value))

    for fam in families.values():
        check_family(fam)
    return families


def check_family(fam):
    if fam.type == "counter":
        for n, l, v in fam.samples:
            if not (v >= 0 or math.isnan(v)):
                raise FormatError(f"{n}{l}: a counter is negative ({v})")
    if fam.type != "histogram":
        return
    groups = {}
    for n, l, v in fam.samples:
        if n == fam.name + "_bucket":
            if "le" not in l:
                raise FormatError(f"{n}{l}: a bucket without 'le'")
            key = frozenset((k, x) for k, x in l.items() if k != "le")
            groups.setdefault(key, {"buckets": []})["buckets"].append((parse_value(l["le"], n), v))
        elif n in (fam.name + "_sum", fam.name + "_count"):
            groups.setdefault(frozenset(l.items()), {"buckets": []})[n[len(fam.name) + 1:]] = v
        else:
            raise FormatError(f"{n}: not a sample name of histogram {fam.name}")
    for key, g in groups.items():
        b = g["buckets"]
        les = [le for le, _ in b]
        if les != sorted(les) or len(set(les)) != len(les):
            raise FormatError(f"{fam.name}{dict(key)}: le values are not strictly increasing")
        if not b or not math.isinf(les[-1]):
            raise FormatError(f"{fam.name}{dict(key)}: no +Inf bucket")
        counts = [v for _, v in b]
        if any(x > y for x, y in zip(counts, counts[1:])):
            raise FormatError(f"{fam.name}{dict(key)}: bucket counts are not cumulative")
        if "count" not in g or g["count"] != counts[-1]:
            raise FormatError(f"{fam.name}{dict(key)}: _count differs from the +Inf bucket")
        if "sum" not in g:
            raise FormatError(f"{fam.name}{dict(key)}: no _sum")


def test_the_parser_rejects_what_the_format_forbids():
    """The parser is strict enough to be trusted with feedd's output."""
    good = '# HELP a_total A.\n# TYPE a_total counter\na_total{x="q\\"\\\\\\n"} 1\n'
    assert parse_exposition(good)["a_total"].value(x='q"\\\n') == 1
    bad = [
        "a 1",                                                   # no final newline
        "a{x=\"1\"} 1\nb 2\na{x=\"2\"} 3\n",                     # not contiguous
        "# TYPE a counter\n# TYPE a counter\na 1\n",             # TYPE twice
        "# TYPE a bogus\na 1\n",                                 # unknown type
        "a{x=\"\\t\"} 1\n",                                      # bad escape
        "a{x=\"1\",x=\"2\"} 1\n",                                # label twice
        "a 1\na 2\n",                                            # series twice
        "a one\n",                                               # not a float
        "# TYPE a counter\na -1\n",                              # negative counter
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",  # not cumulative
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",                          # no +Inf
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",                       # count differs
        "1a 1\n",                                                # bad name
    ]
    for text in bad:
        with pytest.raises(FormatError):
            parse_exposition(text)


# ---------------------------------------------------------------------------
# feedd's endpoint

# Keyed by feed and rank (not pid or connection): a restarted trainer continues its series.
CLIENT_LABELS = {"feed", "rank", "world"}


def small_data(tmp, seed=3):
    d = tmp / "data"
    d.mkdir()
    gen_megatron.main([str(d), "--shards", "2", "--docs-per-shard", "200", "--mean-len", "300", "--seed", str(seed)])
    return d


def metrics_conf(data, listen="127.0.0.1:0", extra=""):
    return (f"[feedd]\nmetrics_listen = {listen}\nring_slots = 6\n{extra}\n"
            + feed_conf("web", f"{data}/*.idx", seq_len=128, batch_size=4)
            + feed_conf("code", f"{data}/shard_000.idx", seq_len=64, batch_size=2, seed=9))


def endpoint(d):
    """(host, port) of d's metrics endpoint, from its status (asked once: a status request is a connection)."""
    if getattr(d, "metrics_endpoint", None) is None:
        listen = d.status()["daemon"]["metrics"]["listen"]
        assert listen, d.log_text()
        host, port = listen.rsplit(":", 1)
        d.metrics_endpoint = host.strip("[]"), int(port)
    return d.metrics_endpoint


def get(d, path="/metrics", method="GET"):
    host, port = endpoint(d)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode()
    finally:
        conn.close()


def scrape(d):
    status, ctype, body = get(d)
    assert status == 200, body
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    return parse_exposition(body)


def wait_for(pred, what, timeout=20):
    deadline = time.time() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


def holding(proc):
    """Waits until a HOLD stream-client has taken every slot of its ring and sits still."""
    for line in proc.stdout:
        if line.startswith("holding"):
            return int(line.split()[1])
        assert not line.startswith("error"), line
    raise AssertionError(f"the client exited: {proc.stderr.read()}")


def test_names_types_and_labels_follow_the_conventions(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data))
    c = d.client("web", 1, 2, 10**6, hold=True)
    try:
        holding(c)
        fams = scrape(d)
        for name, fam in fams.items():
            assert name.startswith("feedd_"), name
            assert fam.type in ("counter", "gauge", "histogram"), f"{name}: no TYPE"
            assert fam.help, f"{name}: no HELP"
            assert (fam.type == "counter") == name.endswith("_total"), f"{name} is a {fam.type}"
            # Base units: seconds and bytes, never ms or MB.
            assert not re.search(r"_(ms|milliseconds|us|mb|kb|percent|pct)(_|$)", name), name
        expected = {
            "feedd_build_info": "gauge", "feedd_uptime_seconds": "gauge", "feedd_gpu_available": "gauge",
            "feedd_clients": "gauge", "feedd_connections_refused_total": "counter",
            "feedd_connections_dropped_total": "counter", "feedd_ring_memory_bytes": "gauge",
            "feedd_feed_batches_total": "counter", "feedd_feed_tokens_total": "counter",
            "feedd_feed_read_bytes_total": "counter", "feedd_feed_documents": "gauge",
            "feedd_feed_bad_records_total": "counter", "feedd_feed_stage_busy_seconds_total": "counter",
            "feedd_feed_ring_memory_bytes": "gauge", "feedd_client_batches_total": "counter",
            "feedd_client_wait_seconds_total": "counter", "feedd_client_step_seconds_total": "counter",
            "feedd_client_stall_ratio": "gauge", "feedd_client_ring_fill": "gauge", "feedd_client_epoch": "gauge",
            "feedd_client_batch_wait_seconds": "histogram", "feedd_client_batch_step_seconds": "histogram",
            "feedd_client_verdict": "gauge", "feedd_client_verdict_severity": "gauge",
        }
        for name, typ in expected.items():
            assert name in fams and fams[name].type == typ, f"{name}: {fams.get(name) and fams[name].type}"
        assert fams["feedd_build_info"].value(version=d.status()["daemon"]["version"]) == 1
        for name, fam in fams.items():
            for n, labels, _ in fam.samples:
                if name.startswith("feedd_client_"):
                    assert set(labels) - {"le", "kind"} == CLIENT_LABELS, f"{n}{labels}"
                    assert labels["rank"] == "1" and labels["world"] == "2"
                    assert labels["feed"] == "web"
                elif name.startswith("feedd_feed_"):
                    assert set(labels) - {"stage"} == {"feed"}, f"{n}{labels}"
        assert set(fams["feedd_connections_refused_total"].values()) == {
            frozenset({("reason", r)}) for r in ("credentials", "limit", "memory", "admin")}
        stages = {dict(l)["stage"] for l in fams["feedd_feed_stage_busy_seconds_total"].values(feed="web")}
        assert {"read", "pack", "job"} <= stages
        # The histogram's buckets are the ring's, at powers of two of nanoseconds.
        les = [dict(l)["le"] for l in fams["feedd_client_batch_wait_seconds"].values("_bucket")]
        assert les[0] == "0.000001024" and les[-2] == "17.179869184" and les[-1] == "+Inf"
    finally:
        c.kill()
        c.wait()


def test_numbers_equal_the_status_document(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data))
    a = d.client("web", 0, 1, 10**6, hold=True)
    b = d.client("code", 1, 3, 10**6, hold=True)
    try:
        holding(a)
        holding(b)
        # Held clients and full rings: nothing moves but the clocks. Wait for the last publish to settle.
        wait_for(lambda: all(c["batches_published"] == c["ring_slots"] for c in d.status()["clients"]),
                 "both rings full")
        # Since-attach histograms are sums of the clamped per-second readings: as of the last tick.
        wait_for(lambda: all(c["telemetry"]["since_attach"]["wait"]["count"] == c["ring_slots"]
                             for c in d.status()["clients"]), "a tick after the last batch")
        endpoint(d)
        st = d.status()
        fams = scrape(d)
        st2 = d.status()
        assert [f["batches"] for f in st["feeds"]] == [f["batches"] for f in st2["feeds"]]

        dm = st["daemon"]
        assert fams["feedd_clients"].value() == len(st["clients"]) == 2
        assert fams["feedd_gpu_available"].value() == (0 if dm["gpu"].startswith("unavailable") else 1)
        assert fams["feedd_connections_accepted_total"].value() == dm["connections_total"]
        assert fams["feedd_ring_memory_bytes"].value() == dm["ring_memory_bytes"] > 0
        for reason, n in dm["refused"].items():
            assert fams["feedd_connections_refused_total"].value(reason=reason) == n
        for reason, n in dm["dropped"].items():
            assert fams["feedd_connections_dropped_total"].value(reason=reason) == n
        assert st["daemon"]["uptime_s"] <= fams["feedd_uptime_seconds"].value() <= st2["daemon"]["uptime_s"]
        assert fams["feedd_worker_threads"].value() == dm["threads"]

        for f in st["feeds"]:
            n = f["name"]
            assert fams["feedd_feed_batches_total"].value(feed=n) == f["batches"] > 0
            assert fams["feedd_feed_tokens_total"].value(feed=n) == f["tokens_served"] > 0
            assert fams["feedd_feed_documents"].value(feed=n) == f["documents"]
            assert fams["feedd_feed_clients"].value(feed=n) == f["clients"] == 1
            assert fams["feedd_feed_ready"].value(feed=n) == 1
            assert fams["feedd_feed_read_bytes_total"].value(feed=n) == f["stages"]["read"]["total_bytes"] > 0
            assert fams["feedd_feed_stage_bytes_total"].value(feed=n, stage="pack") == f["stages"]["pack"]["total_bytes"]
            assert fams["feedd_feed_stage_busy_seconds_total"].value(feed=n, stage="job") > 0
            assert fams["feedd_feed_ring_memory_bytes"].value(feed=n) == sum(
                c["memory_bytes"] for c in st["clients"] if c["feed"] == n)

        for c in st["clients"]:
            sel = dict(feed=c["feed"], rank=c["rank"], world=c["world"])
            assert fams["feedd_client_batches_total"].value(**sel) == c["batches_delivered"] == c["ring_slots"]
            assert fams["feedd_client_batches_published_total"].value(**sel) == c["batches_published"]
            assert fams["feedd_client_ring_fill"].value(**sel) == c["ring_fill"] == 6
            assert fams["feedd_client_ring_slots"].value(**sel) == c["ring_slots"]
            assert fams["feedd_client_epoch"].value(**sel) == c["epoch"] == 0
            assert fams["feedd_client_stuck"].value(**sel) == (1 if c["stuck"] else 0)
            assert fams["feedd_client_reconnects_total"].value(**sel) == c["reconnects"] == 0
            assert fams["feedd_client_reconnect_seconds_total"].value(**sel) == c["reconnect_s"] == 0
            assert math.isclose(fams["feedd_client_wait_seconds_total"].value(**sel), c["wait_s"], abs_tol=1e-9)
            assert math.isclose(fams["feedd_client_step_seconds_total"].value(**sel), c["step_s"], abs_tol=1e-9)
            assert math.isclose(fams["feedd_client_stall_ratio"].value(**sel), c["stall_pct"] / 100, abs_tol=1e-12)
            h = fams["feedd_client_batch_wait_seconds"]
            assert h.value("_count", **sel) == c["telemetry"]["since_attach"]["wait"]["count"] == c["ring_slots"]
            assert math.isclose(h.value("_sum", **sel), c["wait_s"], abs_tol=1e-9)
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_packing_and_mixture_counters_equal_the_status_document(daemon, tmp_path):
    data = small_data(tmp_path)
    conf = (f"[feedd]\nmetrics_listen = 127.0.0.1:0\n"
            + feed_conf("padded", f"{data}/*.idx", seq_len=64, batch_size=2, extra="packing = pad\npad_id = 0\n")
            + "[feed.mix]\nsources = a:0.7, b:0.3\nseq_len = 64\nbatch_size = 2\npacking = bestfit\n"
            + f"[feed.mix.a]\nshards = {data}/shard_000.idx\n[feed.mix.b]\nshards = {data}/shard_001.idx\n")
    d = daemon(conf)
    d.dump("padded", tmp_path / "p", batches=30)
    d.dump("mix", tmp_path / "m", batches=30)
    endpoint(d)
    st = d.status()
    fams = scrape(d)
    for f in st["feeds"]:
        n, pk = f["name"], f["packing"]
        assert fams["feedd_feed_packed_positions_total"].value(feed=n) == pk["positions"] == f["batches"] * 2 * 64
        assert fams["feedd_feed_packed_tokens_total"].value(feed=n) == pk["tokens"] > 0
        assert fams["feedd_feed_truncated_tokens_total"].value(feed=n) == pk["truncated"]
        assert fams["feedd_feed_packed_documents_total"].value(feed=n) == pk["documents"] > 0
        assert fams["feedd_feed_cut_documents_total"].value(feed=n) == pk["cut_documents"]
    padded = next(f for f in st["feeds"] if f["name"] == "padded")
    assert padded["packing"]["truncated"] > 0  # mean length 300 > seq_len 64
    mix = next(f for f in st["feeds"] if f["name"] == "mix")
    for src in mix["packing"]["sources"]:
        assert fams["feedd_feed_source_documents_total"].value(feed="mix", source=src["name"]) == src["documents"] > 0
    assert fams["feedd_feed_source_documents_total"].type == "counter"


def test_verdict_gauge_step_histogram_and_series_that_survive_a_restart(daemon, tmp_path):
    """The diagnosis is exported one-hot by kind; the step histogram is the client's own; a trainer restarted on
    the same rank continues the same series, and a second connection on one rank gets conn="2" (a valid scrape)."""
    data = small_data(tmp_path)
    d = daemon("[diagnosis]\nwindow_s = 3\nmin_batches = 3\n\n" + metrics_conf(data))
    sel = dict(feed="web", rank=0, world=1)
    c = d.client("web", 0, 1, 400, sleep_ms=20)
    try:
        assert c.stdout.readline().strip() == "attached"
        fams = wait_for(lambda: (f := scrape(d))["feedd_client_verdict"].value(kind="compute-bound", **sel) == 1
                        and f, "a compute-bound verdict in the gauge", timeout=30)
        verdict = fams["feedd_client_verdict"].values(**sel)
        assert sum(verdict.values()) == 1 and len(verdict) >= 9
        assert {dict(k)["kind"] for k in verdict} >= {"stopped", "slow-release", "starved", "straggler"}
        assert fams["feedd_client_verdict_severity"].value(**sel) == 0
        st = d.status()
        sc = next(x for x in st["clients"] if x["rank"] == 0)
        steps = fams["feedd_client_batch_step_seconds"]
        n = steps.value("_count", **sel)
        assert n == steps.value("_bucket", le="+Inf", **sel) > 10
        # 20 ms sleeps: most steps fall between 2^24 ns (16.8 ms) and 2^26 ns (67 ms).
        below = {dict(k)["le"]: v for k, v in steps.values("_bucket", **sel).items()}
        assert below["0.016777216"] <= 0.2 * n and below["0.067108864"] >= 0.8 * n, below
        assert steps.value("_sum", **sel) == pytest.approx(n * 0.0205, rel=0.5)
        assert sc["diagnosis"]["kind"] in ("compute-bound", "warming-up")
        before = set(verdict)
    finally:
        c.kill()
        c.wait()
    a, b = d.client("web", 0, 1, 10**6, sleep_ms=20), d.client("web", 0, 1, 10**6, sleep_ms=20)
    try:
        for p in (a, b):
            assert p.stdout.readline().strip() == "attached"
        fams = wait_for(lambda: len((f := scrape(d))["feedd_client_verdict_severity"].values(**sel)) == 2 and f,
                        "two connections on rank 0")
        series = fams["feedd_client_verdict_severity"].values(**sel)
        assert sorted(dict(k).get("conn", "1") for k in series) == ["1", "2"]
        # The restarted rank's first connection has exactly the labels of the one before.
        assert {k for k in fams["feedd_client_verdict"].values(**sel) if "conn" not in dict(k)} == before
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_counters_grow_while_a_client_consumes(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data))
    c = d.client("web", 0, 1, 10**6, sleep_ms=5)
    try:
        assert c.stdout.readline().strip() == "attached"
        sel = dict(feed="web", rank=0, world=1)
        first = wait_for(lambda: (f := scrape(d))["feedd_client_batches_total"].values(**sel) and f,
                         "the client's series")
        n0 = first["feedd_client_batches_total"].value(**sel)
        later = wait_for(lambda: (f := scrape(d))["feedd_client_batches_total"].value(**sel) > n0 + 20 and f,
                         "the client's batches to grow")
        for name in ("feedd_feed_batches_total", "feedd_feed_tokens_total", "feedd_feed_read_bytes_total"):
            assert later[name].value(feed="web") > first[name].value(feed="web"), name
        # The histograms are since attach as of the daemon's last tick (once a second).
        n_first = first["feedd_client_batch_wait_seconds"].value("_count", **sel)
        wait_for(lambda: scrape(d)["feedd_client_batch_wait_seconds"].value("_count", **sel) > n_first,
                 "the wait histogram to grow at a tick")
        assert later["feedd_client_step_seconds_total"].value(**sel) > first["feedd_client_step_seconds_total"].value(**sel)
        # Scrapes count themselves.
        assert later["feedd_metrics_scrapes_total"].value() > first["feedd_metrics_scrapes_total"].value()
        # A client gone is a series gone.
        c.kill()
        c.wait()
        wait_for(lambda: not scrape(d)["feedd_client_batches_total"].values(**sel), "the client's series to go")
    finally:
        if c.poll() is None:
            c.kill()
            c.wait()


def test_other_paths_are_404_and_only_get_is_served(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data))
    endpoint(d)
    base_fds = open_fds(d.proc.pid)
    for path in ("/", "/metricsx", "/metrics/", "/status"):
        status, _, body = get(d, path)
        assert status == 404, (path, status)
        assert "/metrics" in body
    status, _, _ = get(d, "/metrics", method="POST")
    assert status != 200
    status, ctype, body = get(d, "/metrics", method="HEAD")
    assert status == 200 and body == ""
    # A scraper that connects and says nothing, or half a request, is timed out and its fd closed.
    host, port = endpoint(d)
    idle = socket.create_connection((host, port))
    half = socket.create_connection((host, port))
    half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    # The daemon still serves its clients meanwhile.
    assert d.status()["feeds"][0]["state"] == "ready"
    assert scrape(d)["feedd_feed_ready"].value(feed="web") == 1
    for s in (idle, half):
        s.settimeout(30)
        assert s.recv(4096) == b"", "feedd answered an unfinished request"  # closed after its 5 s timeout
        s.close()
    assert open_fds(d.proc.pid) == base_fds, "feedd leaked HTTP connections"


def test_prometheus_client_reads_it_too(daemon, tmp_path):
    """The reference parser of the Python client library agrees (python3-prometheus-client)."""
    parser = pytest.importorskip("prometheus_client.parser", reason="python3-prometheus-client is not installed")
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data))
    c = d.client("web", 0, 1, 10**6, hold=True)
    try:
        holding(c)
        _, _, body = get(d)
        mine = parse_exposition(body)
        theirs = {f.name: f for f in parser.text_string_to_metric_families(body)}
        for name, fam in mine.items():
            # prometheus_client names counter families without _total.
            key = name[:-len("_total")] if fam.type == "counter" else name
            assert key in theirs and theirs[key].type == fam.type, name
            assert len(theirs[key].samples) == len(fam.samples), name
    finally:
        c.kill()
        c.wait()


def listening_inet_sockets(pid):
    """Inodes of the TCP sockets pid holds that listen (state 0A in /proc/net/tcp*)."""
    mine = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    listening = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A":
                    listening.add(cols[9])
    return mine & listening


def test_off_by_default(daemon, tmp_path):
    data = small_data(tmp_path)
    d = daemon(feed_conf("web", f"{data}/*.idx"))
    assert d.status()["daemon"]["metrics"] == {"listen": None, "error": None}
    assert listening_inet_sockets(d.proc.pid) == set()
    d2 = daemon(metrics_conf(data))
    # The metrics listener starts right after the control socket listens (READY=1 comes after both): wait for it.
    deadline = time.monotonic() + 5 * TIME_SCALE
    while not listening_inet_sockets(d2.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(listening_inet_sockets(d2.proc.pid)) == 1


@pytest.mark.parametrize("value, why", [
    ("localhost:9464", "is not a numeric IPv4 address"),
    ("127.0.0.1", "is not ADDRESS:PORT"),
    ("127.0.0.1:65536", "is not ADDRESS:PORT"),
    ("127.0.0.1:http", "is not ADDRESS:PORT"),
    ("::1:9464", "is not a numeric IPv4 address"),
    ("[127.0.0.1]:9464", "is not a numeric IPv6 address"),
    ("", "is not ADDRESS:PORT"),
])
def test_a_bad_value_is_rejected_at_load_with_its_line(tmp_path, value, why):
    data = small_data(tmp_path)
    conf = tmp_path / "bad.conf"
    conf.write_text(f"[feedd]\nthreads = 1\nmetrics_listen = {value}\n" + feed_conf("web", f"{data}/*.idx"))
    p = subprocess.run([str(FEEDD), "-c", str(conf), "--check"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"{conf}:3: metrics_listen: " in p.stderr and why in p.stderr, p.stderr


def test_a_port_in_use_is_logged_and_clients_are_served(daemon, tmp_path):
    data = small_data(tmp_path)
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        d = daemon(metrics_conf(data, listen=f"127.0.0.1:{port}"))
        m = d.status()["daemon"]["metrics"]
        assert m["listen"] == f"127.0.0.1:{port}" and "Address already in use" in m["error"], m
        assert f"metrics_listen 127.0.0.1:{port}: cannot listen: Address already in use" in d.log_text()
        got = d.dump("web", tmp_path / "out", batches=3)
        assert got["input_ids"].shape[0] == 3
    finally:
        taken.close()
    # A reload tries again, and now the port is free.
    d.ctl("reload")
    assert d.status()["daemon"]["metrics"] == {"listen": f"127.0.0.1:{port}", "error": None}
    assert "feedd_clients 0" in get(d)[2]


def test_ipv6_loopback(daemon, tmp_path):
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
        s.close()
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    data = small_data(tmp_path)
    d = daemon(metrics_conf(data, listen="[::1]:0"))
    assert d.status()["daemon"]["metrics"]["listen"].startswith("[::1]:")
    assert scrape(d)["feedd_feed_ready"].value(feed="web") == 1
