#!/bin/sh
# SPDX-License-Identifier: MIT
# Installs what feedd needs to build, test and run the demo on Debian 12.
# Idempotent: asks apt only for packages that are missing. Uses sudo when not root.
set -eu

PKGS="build-essential meson ninja-build pkg-config
liburing-dev libevent-dev libinih-dev libjansson-dev libsystemd-dev
libpcre2-dev libzstd-dev zlib1g-dev libunistring-dev libsnappy-dev libxxhash-dev
libcurl4-openssl-dev libssl-dev python3-boto3
python3 python3-numpy python3-pytest python3-torch python3-prometheus-client
python3-mesonpy python3-venv python3-pip
systemd util-linux
gnuplot-nox prometheus
fio python3-matplotlib libopenblas0-pthread
scdoc man-db groff-base dpkg-dev debhelper dh-python lintian
clang libclang-rt-14-dev valgrind"
# The tokenizer tests fetch their peers from the npm registry; a machine that
# already has node and npm (not from Debian) keeps them.
command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
