#!/bin/sh
# SPDX-License-Identifier: MIT
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer,
# in its own build directory (gcc; FEEDD_ASAN_BUILD_DIR, default build-asan).
#   scripts/sanitize.sh [meson test args...]
# Two passes, so that leaks count everywhere they can:
#  1. the C suites (unit, fuzz replay, tok) with LeakSanitizer on;
#  2. everything else (pytest suites). Python loads the instrumented libfeed
#     through ctypes, so libasan is preloaded into it and LeakSanitizer is off
#     for the interpreter, but every feedd those tests start runs with it on
#     (FEEDD_DAEMON_ENV, read by tests/integration/conftest.py): a leak in
#     the daemon fails the test that stopped it. Time limits in the tests are
#     stretched by FEEDD_TEST_TIME_SCALE=3. In Python ASan leaves SIGSEGV
#     alone (handle_segv=0): test_python expects a real one from a write to
#     the read-only ring. The packaging suite is left out: it builds a .deb
#     with its own, uninstrumented build and has nothing to sanitize.
# Any sanitizer report aborts the process, so it fails its test. Logs:
# $BUILD/meson-logs/testlog-asan-c.json and testlog-asan-py.json.
set -eu
cd "$(dirname "$0")/.."
BUILD=${FEEDD_ASAN_BUILD_DIR:-build-asan}
if [ ! -f "$BUILD/build.ninja" ]; then
	CC=gcc meson setup "$BUILD" --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C "$BUILD" >/dev/null
echo "sanitize: built ($BUILD)" >&2

common="abort_on_error=1:halt_on_error=1:print_summary=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:print_summary=1"
c_suites="--suite unit --suite fuzz --suite tok"
rc=0
# shellcheck disable=SC2086
ASAN_OPTIONS="$common:detect_leaks=1" \
	meson test -C "$BUILD" --no-rebuild --print-errorlogs --logbase testlog-asan-c $c_suites "$@" || rc=$?

libasan=$(gcc -print-file-name=libasan.so)
# shellcheck disable=SC2086
LD_PRELOAD="$libasan" ASAN_OPTIONS="$common:detect_leaks=0:handle_segv=0" \
	FEEDD_DAEMON_ENV="ASAN_OPTIONS=$common:detect_leaks=1" FEEDD_TEST_TIME_SCALE=3 \
	meson test -C "$BUILD" --no-rebuild --print-errorlogs --logbase testlog-asan-py \
	--no-suite unit --no-suite fuzz --no-suite tok --no-suite packaging --timeout-multiplier 3 "$@" || rc=$?
exit $rc
