#!/bin/sh
# SPDX-License-Identifier: MIT
# The test command: install dependencies, build, fetch the tokenizer peers and
# corpus and the Parquet writer (if those suites exist), run every meson test, then the hardening
# stages (ASan+UBSan, valgrind, fuzzing, soak; FEEDD_TEST_STAGES), and end
# with a line "N passed, N failed[, N skipped]" over all of them. Exit status
# is non-zero on any failure.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD=${FEEDD_BUILD_DIR:-build}
if [ -x scripts/fetch-tok-data.sh ]; then
	scripts/fetch-tok-data.sh "$BUILD/tokdata" || echo "test: fetching tokenizer data failed; those tests will skip" >&2
fi
if [ -x scripts/fetch-parquet-data.sh ]; then
	scripts/fetch-parquet-data.sh "$BUILD/pqdata" || echo "test: fetching DuckDB failed; the Parquet tests will skip" >&2
fi
rc=0
# Stages after the plain run (docs/reliability.md): FEEDD_TEST_STAGES picks them, default all.
# Each leaves a meson-style test log; the summary below counts every log of this run, and a
# stage that fails before writing one counts as one failure.
STAGES=${FEEDD_TEST_STAGES:-main sanitize valgrind fuzz soak}
ASAN_BUILD=${FEEDD_ASAN_BUILD_DIR:-build-asan}
FUZZ_BUILD=${FEEDD_FUZZ_BUILD_DIR:-build-fuzz}
LOGS="$BUILD/meson-logs/testlog.json $BUILD/meson-logs/testlog-valgrind.json $BUILD/meson-logs/testlog-soak.json
$ASAN_BUILD/meson-logs/testlog-asan-c.json $ASAN_BUILD/meson-logs/testlog-asan-py.json $FUZZ_BUILD/meson-logs/testlog.json"
# shellcheck disable=SC2086
rm -f $LOGS
stage_failed() { # stage name, log it should have written
	rc=1
	[ -s "$2" ] || { mkdir -p "$(dirname "$2")"; echo "{\"name\": \"stage $1\", \"result\": \"FAIL\"}" >>"$2"; }
	echo "test: stage $1 failed" >&2
}
for stage in $STAGES; do
	echo "test: stage $stage" >&2
	case $stage in
	main) meson test -C "$BUILD" --print-errorlogs "$@" || stage_failed main "$BUILD/meson-logs/testlog.json" ;;
	sanitize) scripts/sanitize.sh || stage_failed sanitize "$ASAN_BUILD/meson-logs/testlog-asan-py.json" ;;
	valgrind) FEEDD_BUILD_DIR=$BUILD scripts/valgrind.sh || stage_failed valgrind "$BUILD/meson-logs/testlog-valgrind.json" ;;
	fuzz) scripts/fuzz.sh || stage_failed fuzz "$FUZZ_BUILD/meson-logs/testlog.json" ;;
	soak) SOAK_JSON="$BUILD/meson-logs/testlog-soak.json" FEEDD_BUILD_DIR=$BUILD scripts/soak.sh "${FEEDD_SOAK_SECONDS:-60}" ||
		stage_failed soak "$BUILD/meson-logs/testlog-soak.json" ;;
	*) echo "test: unknown stage $stage" >&2; exit 2 ;;
	esac
done
# shellcheck disable=SC2086
/usr/bin/python3 - $LOGS <<'PY'
import json, os, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
lines = [l for f in sys.argv[1:] if os.path.exists(f) for l in open(f) if l.strip()]
for line in lines:
    r = json.loads(line).get("result")
    if r in ("OK", "EXPECTEDFAIL"):
        counts["passed"] += 1
    elif r == "SKIP":
        counts["skipped"] += 1
    else:
        counts["failed"] += 1
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
PY
exit $rc
