#!/bin/sh
# SPDX-License-Identifier: MIT
# The pytest tests that start feedd, with every feedd under valgrind
# memcheck: memory errors and definite or indirect leaks make it exit 99,
# which fails the test that stopped it. Uses the meson test setup 'valgrind'
# (top-level meson.build) in $FEEDD_BUILD_DIR (default build); log:
# $BUILD/meson-logs/testlog-valgrind.json.
#   scripts/valgrind.sh [meson test args...]   (default: the tests below)
# Left out by default: test_telemetry (its diagnoses are about speed, which
# valgrind changes 20-50x), test_lifecycle and test_hostile (their reloads
# write configs without the io_engine = pread valgrind needs, and wait with
# fixed deadlines rather than FEEDD_TEST_TIME_SCALE).
set -eu
cd "$(dirname "$0")/.."
BUILD=${FEEDD_BUILD_DIR:-build}
command -v valgrind >/dev/null || { echo "valgrind: not installed (scripts/install-deps.sh)" >&2; exit 1; }
[ $# -gt 0 ] || set -- test_megatron_stream test_python test_crash test_hostile test_text gpu-hostonly test_bad
exec meson test -C "$BUILD" --setup valgrind --print-errorlogs "$@"
