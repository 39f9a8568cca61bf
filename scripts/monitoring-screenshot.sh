#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# scripts/monitoring-screenshot.sh: the screenshots of docs/telemetry.md, taken
# from a real Prometheus scrape of a real feedd (issue 19).
#
#   FEEDD_BUILD_DIR=build scripts/monitoring-screenshot.sh [OUTDIR] [SECONDS]
#
# What it does, all on loopback and in a scratch directory:
#   1. generates a small Megatron dataset (scripts/gen_megatron.py);
#   2. starts the feedd of $FEEDD_BUILD_DIR with `metrics_listen = 127.0.0.1:0`
#      and two feeds: "web" (small batches) read by three ranks of real
#      feed.Loader loops (tests/integration/verdict_client.py), ranks 0 and 1
#      with a 10 ms step, rank 2 with a 40 ms step (a straggler), and "big"
#      (32 x 16384 tokens a batch, one worker thread for the daemon) read by a
#      loop that only takes batches (it starves);
#   3. starts Debian's /usr/bin/prometheus on 127.0.0.1 scraping that feedd
#      every second (job "feedd") with the shipped recording and alert rules,
#      packaging/monitoring/feedd-rules.yml;
#   4. waits SECONDS (default 75), then takes headless Chromium screenshots of
#      Prometheus' own graph view of three of the dashboard's queries
#      (packaging/monitoring/feedd-dashboard.json, with Grafana's variables
#      replaced as tests/integration/test_monitoring.py does): the verdict
#      severity per rank, the data wait share per rank (a recorded series of
#      the rules) and the step time p50 per rank (the panel's first query);
#   5. stops everything it started (SIGTERM, bounded waits, then SIGKILL).
#
# Writes OUTDIR/{verdict-severity,wait-share,step-p50}.png (default
# docs/monitoring). Needs: /usr/bin/prometheus (Debian's prometheus), chromium
# (Debian's chromium; a docs tool, so not in scripts/install-deps.sh), and a
# built tree. Says what is missing and exits 77 when something is.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${FEEDD_BUILD_DIR:-$SRC/build}" 2>/dev/null && pwd || echo "${FEEDD_BUILD_DIR:-$SRC/build}")
OUT=${1:-$SRC/docs/monitoring}
WAIT_S=${2:-75}
PY=/usr/bin/python3
FEEDD=$BUILD/daemon/feedd
FEEDCTL=$BUILD/client/feedctl/feedctl
PROM=/usr/bin/prometheus
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)

missing=()
[ -x "$PROM" ] || missing+=("$PROM (apt-get install prometheus)")
[ -n "$CHROMIUM" ] || missing+=("chromium (apt-get install chromium)")
[ -x "$FEEDD" ] || missing+=("$FEEDD (build first: scripts/build.sh, or set FEEDD_BUILD_DIR)")
[ -x "$FEEDCTL" ] || missing+=("$FEEDCTL")
if [ ${#missing[@]} -gt 0 ]; then
    printf 'monitoring-screenshot: missing: %s\n' "${missing[@]}" >&2
    exit 77
fi

TMP=$(mktemp -d /tmp/feedd-screenshot.XXXXXX)
PIDS=()
stop_all() {
    local pid i
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap stop_all EXIT

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

echo "dataset in $TMP/data"
"$PY" "$SRC/scripts/gen_megatron.py" "$TMP/data" --shards 4 --docs-per-shard 500 --mean-len 600 --seed 3 >/dev/null

cat >"$TMP/feedd.conf" <<EOF
[feedd]
metrics_listen = 127.0.0.1:0
ring_slots = 6

[diagnosis]
window_s = 5

[feed.web]
shards = $TMP/data/*.idx
seq_len = 128
batch_size = 4
seed = 7

[feed.big]
shards = $TMP/data/*.idx
seq_len = 16384
batch_size = 32
seed = 9
EOF
SOCK=$TMP/feedd.sock
"$FEEDD" -c "$TMP/feedd.conf" -s "$SOCK" -t 1 2>"$TMP/feedd.log" >/dev/null &
PIDS+=($!)
for i in $(seq 100); do
    [ -S "$SOCK" ] && "$FEEDCTL" --socket "$SOCK" status --json >/dev/null 2>&1 && break
    sleep 0.1
done
LISTEN=$("$FEEDCTL" --socket "$SOCK" status --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["daemon"]["metrics"]["listen"])')
echo "feedd metrics on $LISTEN"

client() {  # FEED RANK WORLD STEP_MS
    FEEDD_BUILD_DIR=$BUILD "$PY" "$SRC/tests/integration/verdict_client.py" "$SOCK" "$@" >/dev/null 2>>"$TMP/clients.log" &
    PIDS+=($!)
}
client web 0 3 10
client web 1 3 10
client web 2 3 40
client big 0 1 0

PROM_PORT=$(free_port)
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $SRC/packaging/monitoring/feedd-rules.yml
scrape_configs:
  - job_name: feedd
    static_configs:
      - targets: ["$LISTEN"]
EOF
"$PROM" --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
echo "prometheus on 127.0.0.1:$PROM_PORT; waiting ${WAIT_S} s for data"
sleep "$WAIT_S"

up=$("$PY" - "$PROM_PORT" <<'EOF'
import json, sys, urllib.request
r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/api/v1/query?query=up%7Bjob%3D%22feedd%22%7D", timeout=10))
print(r["data"]["result"][0]["value"][1] if r["data"]["result"] else "none")
EOF
)
[ "$up" = 1 ] || { echo "monitoring-screenshot: the feedd target is not up ($up)" >&2; tail -20 "$TMP/prometheus.log" >&2; exit 1; }

mkdir -p "$OUT"
shoot() {  # NAME PANEL-TITLE (the dashboard's panel whose first query is drawn)
    local url
    url=$("$PY" - "$SRC/packaging/monitoring/feedd-dashboard.json" "$2" "$PROM_PORT" <<'EOF'
import json, sys, urllib.parse
dash = json.load(open(sys.argv[1]))
expr = next(p["targets"][0]["expr"] for p in dash["panels"] if p.get("title") == sys.argv[2])
expr = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$feed", ".*")
q = urllib.parse.urlencode({"g0.expr": expr, "g0.tab": "0", "g0.range_input": "1m", "g0.stacked": "0"})
print(f"http://127.0.0.1:{sys.argv[3]}/graph?{q}")
EOF
)
    echo "screenshot $1: $2"
    timeout 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,900 \
        --virtual-time-budget=8000 --screenshot="$OUT/$1.png" "$url" >/dev/null 2>>"$TMP/chromium.log"
}
shoot verdict-severity "Verdict per rank (severity: 0 fine, 1 notice, 2 warning, 3 error)"
shoot wait-share "Data wait share of the trainer's time (5 m)"
shoot step-p50 "Step time p50 / p95"

"$FEEDCTL" --socket "$SOCK" status 2>/dev/null | sed -n '1,40p'
ls -l "$OUT"/*.png
