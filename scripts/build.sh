#!/bin/sh
# SPDX-License-Identifier: MIT
# Configures (once) and builds feedd in ./build (or $FEEDD_BUILD_DIR).
set -eu
cd "$(dirname "$0")/.."
BUILD=${FEEDD_BUILD_DIR:-build}
if [ ! -f "$BUILD/build.ninja" ]; then
	meson setup "$BUILD" --buildtype=debugoptimized >/dev/null
fi
ninja -C "$BUILD" >/dev/null
echo "build: ok ($BUILD)" >&2
