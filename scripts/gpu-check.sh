#!/bin/sh
# SPDX-License-Identifier: MIT
# Everything about GPU staging that needs a GPU, in one command (docs/gpu.md):
#
#   scripts/gpu-check.sh [BUILD_DIR]                (default: build-gpu)
#   scripts/gpu-check.sh --prebuilt BUNDLE_DIR      (from scripts/gpu-bundle.sh)
#
# 1. builds BUILD_DIR with -Dcuda=enabled (fails if the toolkit is missing);
#    with --prebuilt nothing is configured or compiled: a machine that can
#    install nothing runs the bundle's programs with its libraries (BUNDLE/lib);
# 2. the unit and host-side tests of GPU staging (test-gpu, test_hostonly.py),
#    then tests/gpu (two real processes, bit-for-bit batches with a
#    concurrent consumer kernel, client SIGKILL mid-batch, daemon restart);
# 3. bench/gpu_h2d (staging GB/s vs plain pinned cudaMemcpyAsync, client CPU
#    time per batch) and bench/gpu_trainer/run.py (data wait per step: feedd's
#    device batches vs DataLoader + pin_memory + non_blocking).
# Results go to stdout and to BUILD_DIR/gpu-check/ (or $FEEDD_GPU_CHECK_OUT);
# the figures belong in docs/benchmarks.md with the date and the device
# (nvidia-smi -L is recorded).
# The Python steps use the first of $FEEDD_PYTHON, python3, /usr/bin/python3
# that imports torch, numpy and pytest.
# Exit status: 0 all passed; 1 a step failed; 2 a prerequisite is missing
# (each named: no CUDA build, no bundled library, no usable Python); 77 no
# usable GPU (every step says why).
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
prebuilt=false
if [ "${1:-}" = "--prebuilt" ]; then
	prebuilt=true
	shift
	[ $# -ge 1 ] || { echo "gpu-check: --prebuilt needs the bundle's directory" >&2; exit 2; }
fi
build=$(cd "$here" && realpath -m "${1:-$here/build-gpu}")
cd "$here"

missing=""
if $prebuilt; then
	[ -x "$build/daemon/feedd" ] || missing="$missing; $build/daemon/feedd (make the bundle with scripts/gpu-bundle.sh)"
	[ -d "$build/lib" ] || missing="$missing; $build/lib (the bundled libraries)"
	export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
	for tool in meson ninja cc pkg-config; do
		command -v "$tool" >/dev/null 2>&1 || missing="$missing; $tool (or use --prebuilt)"
	done
	if [ -z "$missing" ]; then
		if [ ! -f "$build/build.ninja" ]; then
			meson setup "$build" -Dcuda=enabled
		else
			meson configure "$build" -Dcuda=enabled
		fi
		ninja -C "$build"
	fi
fi
if [ -z "$missing" ]; then
	grep -q '#define HAVE_CUDA 1' "$build/config.h" 2>/dev/null || missing="$missing; a CUDA build in $build"
	if [ -x "$build/daemon/feedd" ] && ldd "$build/daemon/feedd" | grep -q 'not found'; then
		missing="$missing; libraries of feedd: $(ldd "$build/daemon/feedd" | awk '/not found/ { printf "%s ", $1 }')"
	fi
fi
py=""
for cand in ${FEEDD_PYTHON:-} python3 /usr/bin/python3; do
	command -v "$cand" >/dev/null 2>&1 || continue
	if "$cand" -c 'import torch, numpy, pytest' >/dev/null 2>&1; then
		py=$(command -v "$cand")
		break
	fi
done
[ -n "$py" ] || missing="$missing; a Python with torch, numpy and pytest (set FEEDD_PYTHON)"
if [ -n "$missing" ]; then
	echo "gpu-check: missing prerequisites:${missing#;}" >&2
	exit 2
fi

out=${FEEDD_GPU_CHECK_OUT:-$build/gpu-check}
mkdir -p "$out"
export FEEDD_BUILD_DIR="$build"
{ date -u; nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"; echo "python: $py"; } | tee "$out/device.txt"

failed=""
skipped=""
# step NAME CMD...: runs CMD, its output to the terminal and to $out/NAME.txt, and files its exit status.
step() {
	name=$1
	shift
	echo "== $name: $*"
	"$@" >"$out/$name.txt" 2>&1 && rc=0 || rc=$?
	cat "$out/$name.txt"
	case $rc in
	0) echo "== $name: ok" ;;
	77) echo "== $name: skipped"; skipped="$skipped $name" ;;
	*) echo "== $name: FAILED (exit status $rc)"; failed="$failed $name" ;;
	esac
}

# Run directly, not through meson: a prebuilt tree has no meson, and its build files name another machine's paths.
step unit "$build/tests/unit/test-gpu"
step hostonly "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_hostonly.py
# tests/gpu/run.py exits 77 itself, saying why, without a device (meson would report that as a pass).
step tests-gpu "$py" tests/gpu/run.py
step gpu_h2d "$build/bench/gpu_h2d"
step gpu_h2d_large "$build/bench/gpu_h2d" 32 8192 2000
step gpu_trainer "$py" bench/gpu_trainer/run.py --build "$build" --json "$out/gpu_trainer.json"

echo "gpu-check: results in $out${skipped:+; skipped:$skipped}${failed:+; FAILED:$failed}"
[ -z "$failed" ] || exit 1
[ -z "$skipped" ] || exit 77
exit 0
