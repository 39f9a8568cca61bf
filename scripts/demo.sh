#!/bin/sh
# SPDX-License-Identifier: MIT
# The demo: build feedd, generate a small Megatron dataset, start feedd on
# config/demo.conf, train a C example against it (simulated 20 ms steps),
# show `feedctl status` while it runs, and stop feedd cleanly.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD=${FEEDD_BUILD_DIR:-build}
DEMO="$BUILD/demo"
SOCK="$DEMO/feedd.sock"
mkdir -p "$DEMO"
if [ ! -f "$DEMO/data/shard_007.idx" ]; then
	/usr/bin/python3 scripts/gen_megatron.py "$DEMO/data" --shards 8 --docs-per-shard 2000 --mean-len 700 \
		--empty-frac 0.01 --multi-seq-frac 0.1 --seed 1
fi

"$BUILD/daemon/feedd" -c config/demo.conf -s "$SOCK" 2>"$DEMO/feedd.log" &
FEEDD=$!
trap 'kill $FEEDD 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done
[ -S "$SOCK" ] || { cat "$DEMO/feedd.log"; echo "demo: feedd did not start" >&2; exit 1; }

echo "== trainer: rank 0 of 1, 300 steps of 20 ms on feed 'demo' (B=8, L=4096)"
"$BUILD/examples/train_c" --socket "$SOCK" --feed demo --steps 300 --step-ms 20 &
TRAIN=$!
sleep 2
echo
echo "== feedctl status (while training)"
"$BUILD/client/feedctl/feedctl" --socket "$SOCK" status
echo
wait $TRAIN
echo
echo "== stopping feedd"
kill -TERM $FEEDD
wait $FEEDD
trap - EXIT
tail -n 4 "$DEMO/feedd.log"
echo "demo: ok (host-only mode: no GPU on this machine; see docs/architecture.md)"
