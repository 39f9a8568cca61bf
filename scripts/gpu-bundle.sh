#!/bin/sh
# SPDX-License-Identifier: MIT
# Makes a prebuilt tree for a GPU machine that can install nothing (docs/gpu.md):
#
#   scripts/gpu-bundle.sh [--from BUILD_DIR] [OUT_DIR]     (default OUT_DIR: gpu-bundle)
#
# Builds build-gpu with -Dcuda=enabled (or takes an existing BUILD_DIR built
# with CUDA), then copies into OUT_DIR what scripts/gpu-check.sh --prebuilt
# runs: feedd, feedctl, libfeed, the test and bench programs, config.h, and in
# OUT_DIR/lib every shared library they need beyond glibc (from ldd), so the
# other machine needs neither meson, ninja, a compiler, pkg-config nor a single
# -dev package. The CUDA runtime is linked statically (meson.build); the driver
# (libcuda.so.1) is the GPU machine's own and is never bundled.
# Carry OUT_DIR (a few MiB) with the source tree, then run there:
#   scripts/gpu-check.sh --prebuilt OUT_DIR
set -eu
cd "$(dirname "$0")/.."

from=""
if [ "${1:-}" = "--from" ]; then
	from=$2
	shift 2
fi
out=${1:-gpu-bundle}

if [ -z "$from" ]; then
	from=build-gpu
	if [ ! -f "$from/build.ninja" ]; then
		meson setup "$from" --buildtype=debugoptimized -Dcuda=enabled >/dev/null
	else
		meson configure "$from" -Dcuda=enabled >/dev/null
	fi
	ninja -C "$from" >/dev/null
fi
grep -q '#define HAVE_CUDA 1' "$from/config.h" || {
	echo "gpu-bundle: $from was built without CUDA (meson -Dcuda=enabled needs the toolkit)" >&2
	exit 1
}

# Paths relative to the build dir, as tests/integration/conftest.py and
# bench/gpu_trainer.py expect them under FEEDD_BUILD_DIR.
progs="daemon/feedd client/feedctl/feedctl tests/integration/stream-client tests/unit/test-gpu bench/gpu_h2d bench/consume"
rm -rf "$out"
mkdir -p "$out/lib"
cp "$from/config.h" "$out/"
for p in $progs; do
	[ -x "$from/$p" ] || continue
	mkdir -p "$out/$(dirname "$p")"
	cp "$from/$p" "$out/$p"
done
mkdir -p "$out/client"
for l in "$from"/client/libfeed.so*; do [ -d "$l" ] || cp -P "$l" "$out/client/"; done

# Every NEEDED library outside glibc and the GPU driver, resolved here.
for f in $(find "$out" -type f \( -perm -u+x -o -name '*.so*' \) ! -path "$out/lib/*"); do
	ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
	case $(basename "$lib") in
	libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*.so.* | libresolv.so.*) ;;
	libcuda.so.* | libnvidia-*) ;;
	libfeed.so*) ;;
	*) cp -L "$lib" "$out/lib/" ;;
	esac
done
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1)): $(ls "$out/lib" | tr '\n' ' ')" >&2
