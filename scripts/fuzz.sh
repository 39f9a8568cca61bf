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
# Every fuzz target and its seeds, as tests/fuzz/meson.build declares them
# (a list kept here went stale: a new target was never built, and its test
# could not run).
targets=$(meson introspect "$BUILD" --targets | /usr/bin/python3 -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
names = (os.path.relpath(f, build) for t in json.load(sys.stdin) for f in t["filename"])
print(" ".join(sorted(n for n in names if n.startswith(("tests/fuzz/fuzz-", "tests/fuzz/seeds-")))))
' "$BUILD")
[ -n "$targets" ] || { echo "fuzz: no fuzz targets in $BUILD" >&2; exit 1; }
# shellcheck disable=SC2086
ninja -C "$BUILD" $targets >/dev/null
echo "fuzz: built ($BUILD), ${FEEDD_FUZZ_SECONDS:-20}s per target" >&2
exec meson test -C "$BUILD" --no-rebuild --print-errorlogs --suite fuzz --suite fuzzing "$@"
