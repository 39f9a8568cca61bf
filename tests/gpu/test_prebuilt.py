# SPDX-License-Identifier: MIT
"""scripts/gpu-check.sh --prebuilt on a machine that can install nothing.

The GPU machines this project is lent have a driver, CUDA and PyTorch, and
none of the -dev packages, meson, ninja or a compiler. This test makes such a
machine here: scripts/gpu-bundle.sh bundles this build, then in a private
mount namespace the system's copies of every bundled library, the headers,
the pkg-config files and the build tools are hidden (bind-mounted over), and
gpu-check.sh --prebuilt must still run every step: the host-side ones pass,
the GPU ones say there is no GPU (exit 77), none fails. A missing bundle is
a missing prerequisite (exit 2), never "no GPU".
Runs with Debian's /usr/bin/python3; needs root and unshare(1) (else skips).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from conftest import BUILD, SRC  # noqa: E402

HIDE_TOOLS = ("meson", "ninja", "cc", "gcc", "pkg-config", "nvcc")


def cuda_build():
    return "#define HAVE_CUDA 1" in (BUILD / "config.h").read_text()


def test_missing_bundle_is_a_missing_prerequisite(tmp_path):
    r = subprocess.run([str(SRC / "scripts" / "gpu-check.sh"), "--prebuilt", str(tmp_path / "nothing")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "missing prerequisites" in r.stderr and "gpu-bundle.sh" in r.stderr, r.stderr


def test_prebuilt_runs_where_nothing_is_installed(tmp_path):
    if not cuda_build():
        pytest.skip("this build has no CUDA (a bundle is made from a -Dcuda=enabled build)")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding the system's libraries needs root and unshare(1)")
    feedd_ldd = subprocess.run(["ldd", str(BUILD / "daemon" / "feedd")], capture_output=True, text=True).stdout
    if "libasan" in feedd_ldd or "libubsan" in feedd_ldd:
        pytest.skip("a sanitizer build (scripts/sanitize.sh) is not what a GPU machine is given")
    bundle = tmp_path / "bundle"
    subprocess.run([str(SRC / "scripts" / "gpu-bundle.sh"), "--from", str(BUILD), str(bundle)], check=True,
                   capture_output=True, timeout=300)
    libs = sorted(p.name for p in (bundle / "lib").iterdir())
    assert "liburing.so.2" in libs and "libevent-2.1.so.7" in libs, libs
    # The system copies of the bundled libraries, as the loader would find them without the bundle
    # (not the compiler's runtime, which every program here needs, /bin/sh included).
    system = {}
    for line in feedd_ldd.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[0] in libs and not parts[0].startswith("libgcc_s"):
            system[parts[0]] = os.path.realpath(parts[2])
    assert "liburing.so.2" in system, feedd_ldd
    hide = list(system.values())
    hide += [p for p in (shutil.which(t) for t in HIDE_TOOLS) if p]
    # mount(8) itself needs some of the hidden libraries: it runs on the bundle's copies.
    script = ["set -e", f"export LD_LIBRARY_PATH={bundle}/lib",
              "mount -t tmpfs none /usr/include", "mount -t tmpfs none /usr/lib/x86_64-linux-gnu/pkgconfig"]
    script += [f"mount --bind /dev/null {h}" for h in hide]
    script += ["unset LD_LIBRARY_PATH",
               f"if {BUILD}/daemon/feedd --version >/dev/null 2>&1; then "
               "echo 'feedd still loads the system libraries' >&2; exit 3; fi",
               f"exec {SRC}/scripts/gpu-check.sh --prebuilt {bundle}"]
    env = dict(os.environ, FEEDD_GPU_CHECK_OUT=str(tmp_path / "out"))
    env.pop("LD_LIBRARY_PATH", None)
    env.pop("FEEDD_BUILD_DIR", None)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    out = r.stdout + r.stderr
    if r.returncode == 1 and "mount:" in out and "permission denied" in out.lower():
        pytest.skip(f"this machine does not allow bind mounts in a namespace: {out[-300:]}")
    assert "FAILED" not in out, out[-4000:]
    assert r.returncode == 77, (r.returncode, out[-4000:])
    for step in ("unit", "hostonly"):
        assert f"== {step}: ok" in out, out[-4000:]
    for step in ("tests-gpu", "gpu_h2d", "gpu_trainer"):
        assert f"== {step}: skipped" in out, out[-4000:]
