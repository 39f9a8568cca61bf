# SPDX-License-Identifier: MIT
"""Shared helpers of the packaging tests (tests/packaging/meson.build).

Run by hand with
  FEEDD_BUILD_DIR=build-x FEEDD_SOURCE_DIR=. /usr/bin/python3 -m pytest tests/packaging
A file whose every test skipped (a tool is missing) exits 77, so meson
reports SKIP instead of OK.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SRC = Path(os.environ.get("FEEDD_SOURCE_DIR", Path(__file__).resolve().parents[2])).resolve()
BUILD = Path(os.environ.get("FEEDD_BUILD_DIR", SRC / "build")).resolve()
VERSION = os.environ.get("FEEDD_VERSION", "0.1.0")
MAN_PAGES = ["feedd.8", "feedctl.1", "feedd.conf.5", "libfeed.3"]


def need(*tools):
    """Skips the calling test unless every tool is on PATH."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/install-deps.sh installs it)")


def run(args, check=True, **kw):
    """Runs a command, capturing text output; on failure the assertion shows both streams."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if check:
        assert p.returncode == 0, f"{' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def man_dir(tmp):
    """A MANPATH directory holding the man pages of the build tree."""
    built = [BUILD / "docs" / "man" / p for p in MAN_PAGES]
    if not all(p.exists() for p in built):
        pytest.skip("man pages not built (the `docs` feature needs scdoc)")
    root = Path(tmp) / "man"
    for p in built:
        section = root / f"man{p.suffix[1:]}"
        section.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, section / p.name)
    return root


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    ran = sum(len(reporter.stats.get(k, [])) for k in ("passed", "failed", "error"))
    if ran == 0 and reporter.stats.get("skipped"):
        session.exitstatus = 77
