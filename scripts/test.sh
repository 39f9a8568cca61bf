#!/bin/sh
# SPDX-License-Identifier: MIT
# The test command: install dependencies, build, fetch the tokenizer peers and
# corpus (if that suite exists), run every meson test, and end with a line
# "N passed, N failed[, N skipped]". Exit status is non-zero on any failure.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BUILD=${FEEDD_BUILD_DIR:-build}
if [ -x scripts/fetch-tok-data.sh ]; then
	scripts/fetch-tok-data.sh "$BUILD/tokdata" || echo "test: fetching tokenizer data failed; those tests will skip" >&2
fi
rc=0
meson test -C "$BUILD" --print-errorlogs "$@" || rc=$?
/usr/bin/python3 - "$BUILD/meson-logs/testlog.json" <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for line in open(sys.argv[1]):
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
