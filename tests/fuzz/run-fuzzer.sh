#!/bin/sh
# SPDX-License-Identifier: MIT
# Fuzzes one libFuzzer target for a bounded time (suite 'fuzzing' of a
# -Dfuzz=true build; see scripts/fuzz.sh).
#   run-fuzzer.sh EXE NAME SEEDS CORPUS
# New coverage goes to a scratch corpus in the build directory. A crash, leak
# or timeout is a finding: its input is copied into CORPUS (the committed
# reproducers, tests/fuzz/corpus/NAME/) so that the plain replay test
# fails until the bug is fixed, and this test fails naming the file.
set -eu
exe=$1 name=$2 seeds=$3 corpus=$4
seconds=${FEEDD_FUZZ_SECONDS:-20}
work=$(dirname "$exe")/fuzz-work/$name
art=$(dirname "$exe")/fuzz-artifacts/$name
mkdir -p "$work" "$art"
rm -f "$art"/*
dirs="$work $seeds"
[ -d "$corpus" ] && dirs="$dirs $corpus"
rc=0
# shellcheck disable=SC2086
"$exe" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
	-artifact_prefix="$art/" $dirs >"$art.log" 2>&1 || rc=$?
tail -n 40 "$art.log"
found=$(find "$art" -type f | head -n 20)
if [ -n "$found" ]; then
	mkdir -p "$corpus"
	for f in $found; do
		sum=$(sha1sum "$f" | cut -c1-16)
		cp "$f" "$corpus/$(basename "$f" | cut -d- -f1)-$sum"
		echo "run-fuzzer: $name: finding $(basename "$f") saved as $corpus/$(basename "$f" | cut -d- -f1)-$sum" >&2
	done
	exit 1
fi
[ "$rc" -eq 0 ] || { echo "run-fuzzer: $name: libFuzzer exited with $rc" >&2; exit 1; }
echo "run-fuzzer: $name: ${seconds}s, no finding"
