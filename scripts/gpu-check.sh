#!/bin/sh
# SPDX-License-Identifier: MIT
# Everything about GPU staging that needs a GPU, in one command (docs/gpu.md):
#
#   scripts/gpu-check.sh [BUILD_DIR]      (default: build-gpu)
#
# 1. configures BUILD_DIR with -Dcuda=enabled (fails if the toolkit is missing)
#    and builds it;
# 2. the unit and host-side tests of GPU staging (suite unit: unit-gpu, and
#    gpu-hostonly), then tests/gpu (suite gpu: two real processes, bit-for-bit
#    batches with a concurrent consumer kernel, client SIGKILL mid-batch,
#    daemon restart);
# 3. bench/gpu_h2d (staging GB/s vs a plain pinned cudaMemcpy, client CPU
#    time per batch) and bench/gpu_trainer/run.py (data wait per step: feedd's
#    device batches vs DataLoader + pin_memory + non_blocking).
# Results go to stdout and to BUILD_DIR/gpu-check/; the figures belong in
# docs/benchmarks.md with the date and the device (nvidia-smi -L is recorded).
# Exits 77 when there is no usable GPU (every step says why), 1 on a failure.
# Needs /usr/bin/python3 with torch built for CUDA, and the CUDA toolkit.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build-gpu}
py=/usr/bin/python3
cd "$here"

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" -Dcuda=enabled
else
	meson configure "$build" -Dcuda=enabled
fi
ninja -C "$build"
out=$build/gpu-check
mkdir -p "$out"
export FEEDD_BUILD_DIR="$build"
{ date -u; nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"; } | tee "$out/device.txt"

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

step unit meson test -C "$build" --print-errorlogs unit-gpu gpu-hostonly
# tests/gpu/run.py exits 77 itself, saying why, without a device (meson would report that as a pass).
step tests-gpu "$py" tests/gpu/run.py
step gpu_h2d "$build/bench/gpu_h2d"
step gpu_h2d_large "$build/bench/gpu_h2d" 32 8192 2000
step gpu_trainer "$py" bench/gpu_trainer/run.py --build "$build" --json "$out/gpu_trainer.json"

echo "gpu-check: results in $out${skipped:+; skipped:$skipped}${failed:+; FAILED:$failed}"
[ -z "$failed" ] || exit 1
[ -z "$skipped" ] || exit 77
exit 0
