#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs every experiment of bench/ (one folder each, listed in bench/common.py's
# EXPERIMENTS) and regenerates the measured part of docs/benchmarks.md and its
# plots (docs/benchmarks/*.png).
#
#   bench/run.sh [--build DIR] [--full] [--rounds N] [--results DIR] [--no-doc]
#                [--note TEXT] [--only "io parallel ..."]
#
# --build    a configured and built tree (default: build); its daemon/feedd,
#            bench/consume, bench/io, bench/scaling are used
# --full     the sizes meant for a bigger machine (more data, more clients,
#            more steps); the default fits a 2-core VM in under 15 minutes
# --results  where the raw results go (default: a new /tmp/feedd-bench.*)
# --no-doc   print the tables, leave docs/ alone
# --note     words added to every table's machine line ("loaded by ...")
# --only     a subset of the experiments (`bench/common.py --list`): io parallel
#            starvation padding gpu_h2d gpu_trainer e2e scaling textpath
#            torch_loop metrics_scrape telemetry_overhead spine restart loadtest elastic tok
#
# "text" experiments (starvation, padding, gpu_h2d, ...) are run as they are
# when present, and their output is kept verbatim (in the doc when they have a
# section there); when absent the doc says so.
# Needs Debian's /usr/bin/python3 with numpy, torch, matplotlib, and fio
# (scripts/install-deps.sh). Cold-cache rows drop the page cache as root.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
build=$here/build
full=""
rounds=2
results=""
doc=1
note=""
only=""
py=/usr/bin/python3

while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--full) full=--full; shift ;;
	--rounds) rounds=$2; shift 2 ;;
	--results) results=$2; shift 2 ;;
	--no-doc) doc=0; shift ;;
	--note) note=$2; shift 2 ;;
	--only) only=$2; shift 2 ;;
	-h|--help) sed -n '3,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done

build=$(cd "$build" && pwd)
for f in daemon/feedd bench/consume bench/io bench/scaling; do
	[ -x "$build/$f" ] || { echo "run.sh: $build/$f is missing: build first (ninja -C $build)" >&2; exit 1; }
done
[ -n "$results" ] || results=$(mktemp -d /tmp/feedd-bench.XXXXXX)
mkdir -p "$results"
export FEEDD_BUILD_DIR="$build"

want() { [ -z "$only" ] && return 0; case " $only " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
start=$(date +%s)
failed=""

# A "json" experiment: NAME; bench/NAME/run.py writes NAME.json.
experiment() {
	name=$1
	want "$name" || return 0
	echo "run.sh: $name ($(($(date +%s) - start)) s so far)" >&2
	set -- "$here/bench/$name/run.py" --build "$build" --rounds "$rounds" --json "$results/$name.json"
	[ -z "$full" ] || set -- "$@" --full
	[ -z "$note" ] || set -- "$@" --note "$note"
	if ! $py "$@" 2>"$results/$name.err"; then
		tail -5 "$results/$name.err" >&2
		echo "failed: see $results/$name.err" >"$results/$name.status"
		failed="$failed $name"
	fi
}

# A "text" experiment, run as it is: NAME BUILD_ARG; writes NAME.txt and NAME.status.
foreign() {
	name=$1
	want "$name" || return 0
	echo "run.sh: $name ($(($(date +%s) - start)) s so far)" >&2
	cmd=""
	if [ -f "$here/bench/$name/run.py" ]; then
		cmd="$py $here/bench/$name/run.py"
		[ "$2" = 0 ] || cmd="$cmd --build $build"
	elif [ -x "$build/bench/$name" ]; then
		cmd="$build/bench/$name"
	elif [ -d "$here/bench/$name" ]; then
		echo "not available yet: bench/$name/ is there but not built in $build" >"$results/$name.status"
	else
		echo "not available yet: bench/$name/ does not exist in this tree" >"$results/$name.status"
	fi
	if [ -n "$cmd" ]; then
		rc=0
		$cmd >"$results/$name.txt" 2>&1 || rc=$?
		case $rc in
		0) echo ok >"$results/$name.status" ;;
		77) echo "skipped (exit status 77)" >"$results/$name.status" ;;
		*) echo "failed with exit status $rc" >"$results/$name.status"; failed="$failed $name" ;;
		esac
		cat "$results/$name.txt"
	fi
	cat "$results/$name.status"
}

# A "print" experiment: its figures are kept by hand in the doc; this run prints its own for comparison.
printed() {
	name=$1
	want "$name" || return 0
	echo "run.sh: $name ($(($(date +%s) - start)) s so far)" >&2
	$py "$here/bench/$name/run.py" --build "$build" --rounds "$rounds" | tee "$results/$name.txt" || failed="$failed $name"
}

# The tokenizer alone: needs the corpus of scripts/fetch-tok-data.sh and bench/tok/bench-tok.
tok() {
	want tok || return 0
	tokdata=${FEEDD_TOKDATA:-$build/tokdata}
	if [ -x "$build/bench/tok/bench-tok" ] && [ -f "$tokdata/corpus.txt" ]; then
		echo "run.sh: tok ($(($(date +%s) - start)) s so far)" >&2
		FEEDD_TOKDATA=$tokdata "$build/bench/tok/bench-tok" --encoding cl100k_base | tee "$results/tok.txt" ||
			failed="$failed tok"
	else
		echo "tok: not available: no $tokdata/corpus.txt (scripts/fetch-tok-data.sh fetches it)"
	fi
}

$py "$here/bench/common.py" --list >"$results/experiments"
for name in $only; do
	grep -q "^$name " "$results/experiments" || { echo "run.sh: no experiment '$name' (bench/common.py --list)" >&2; exit 2; }
done
# Read on fd 3: the experiments' own processes inherit stdin.
while read -r name kind build_arg <&3; do
	case $kind in
	json) experiment "$name" ;;
	text) foreign "$name" "$build_arg" ;;
	print) printed "$name" ;;
	tok) tok ;;
	esac
done 3<"$results/experiments"

if [ "$doc" = 1 ]; then
	$py "$here/bench/report.py" "$results" --doc "$here/docs/benchmarks.md" --plots "$here/docs/benchmarks"
fi
echo "run.sh: done in $(($(date +%s) - start)) s; results in $results${failed:+; failed:$failed}" >&2
[ -z "$failed" ]
