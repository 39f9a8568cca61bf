#!/bin/sh
# SPDX-License-Identifier: MIT
# Builds the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan) in
# their own build directory and fuzzes each one for a bounded time.
#   scripts/fuzz.sh [meson test args...]
# FEEDD_FUZZ_BUILD_DIR (default build-fuzz), FEEDD_FUZZ_SECONDS per target
# (default 20). A finding is copied into tests/fuzz/corpus/TARGET/ (commit
# it: the plain replay test then fails until the bug is fixed) and this
# script exits non-zero. Results land in $BUILD/meson-logs/testlog.json.
set -eu
cd "$(dirname "$0")/.."
BUILD=${FEEDD_FUZZ_BUILD_DIR:-build-fuzz}
if [ ! -f "$BUILD/build.ninja" ]; then
	CC=clang meson setup "$BUILD" -Dfuzz=true --buildtype=debugoptimized >/dev/null
fi
targets=""
for t in wire idx rankfile hf ring jsonl parquet sums; do
	targets="$targets tests/fuzz/fuzz-$t tests/fuzz/seeds-$t"
done
# shellcheck disable=SC2086
ninja -C "$BUILD" $targets >/dev/null
echo "fuzz: built ($BUILD), ${FEEDD_FUZZ_SECONDS:-20}s per target" >&2
exec meson test -C "$BUILD" --no-rebuild --print-errorlogs --suite fuzz --suite fuzzing "$@"
