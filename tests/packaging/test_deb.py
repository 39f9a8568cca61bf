# SPDX-License-Identifier: MIT
"""The Debian package, built with dpkg-buildpackage from a copy of the tree:
its contents and control data, lintian, and the packaged programs at work
(feedd, feedctl, the Python package and a program built against libfeed-dev)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SRC, VERSION, need, run

ARCH = None


def source_files():
    """The files of the tree as git would ship them (tracked and new, not
    ignored), or everything but build directories outside a git checkout."""
    if (SRC / ".git").exists() and shutil.which("git"):
        p = run(["git", "-C", SRC, "ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        return [f for f in p.stdout.split("\0") if f and (SRC / f).is_file()]
    out = []
    for root, dirs, files in os.walk(SRC):
        rel = Path(root).relative_to(SRC)
        dirs[:] = [d for d in dirs if not (rel == Path(".") and (d.startswith("build") or d.startswith(".")))]
        out += [str(rel / f) for f in files]
    return out


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    need("dpkg-buildpackage", "dh", "dpkg-deb", "dpkg-architecture")
    global ARCH
    ARCH = run(["dpkg-architecture", "-qDEB_HOST_ARCH"]).stdout.strip()
    unmet = run(["dpkg-checkbuilddeps", SRC / "debian" / "control"], check=False)
    if unmet.returncode != 0:
        pytest.skip(f"build dependencies missing: {unmet.stderr.strip()} (scripts/install-deps.sh installs them)")
    top = tmp_path_factory.mktemp("deb")
    tree = top / f"feedd-{VERSION}"
    for f in source_files():
        (tree / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(SRC / f, tree / f)
    env = dict(os.environ, DEB_BUILD_OPTIONS=f"nocheck parallel={os.cpu_count() or 2}")
    env.pop("MAKEFLAGS", None)
    t = time.monotonic()
    p = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=tree, env=env, capture_output=True,
                       text=True)
    print(f"dpkg-buildpackage: {time.monotonic() - t:.0f} s")
    assert p.returncode == 0, "dpkg-buildpackage failed:\n" + (p.stdout + p.stderr)[-6000:]
    return top


def deb(top, name):
    path = top / f"{name}_{VERSION}_{ARCH}.deb"
    assert path.exists(), sorted(x.name for x in top.iterdir())
    return path


def contents(path):
    """Paths in the package, without the leading '.', directories ending in '/'."""
    out = {}
    for line in run(["dpkg-deb", "-c", path]).stdout.splitlines():
        f = line.split(None, 5)[5]
        target = None
        if " -> " in f:
            f, target = f.split(" -> ", 1)
        out[f[1:]] = target
    return out


def field(path, name):
    return run(["dpkg-deb", "-f", path, name]).stdout.strip()


def multiarch():
    return run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()


def test_every_promised_file_is_packaged(debs):
    ma = multiarch()
    promised = {
        "feedd": ["/usr/sbin/feedd", "/usr/bin/feedctl", "/etc/feedd/feedd.conf",
                  "/lib/systemd/system/feedd.service", "/lib/systemd/system/feedd.socket",
                  "/usr/lib/sysusers.d/feedd.conf", "/usr/share/man/man8/feedd.8.gz",
                  "/usr/share/man/man1/feedctl.1.gz", "/usr/share/man/man5/feedd.conf.5.gz",
                  "/usr/share/doc/feedd/copyright"],
        "libfeed0": [f"/usr/lib/{ma}/libfeed.so.0"],
        "libfeed-dev": ["/usr/include/feed/feed.h", f"/usr/lib/{ma}/libfeed.so",
                        f"/usr/lib/{ma}/pkgconfig/libfeed.pc", "/usr/share/man/man3/libfeed.3.gz"],
        "python3-feed": ["/usr/lib/python3/dist-packages/feed/_installed.py"],
    }
    for pkg, files in promised.items():
        have = contents(deb(debs, pkg))
        missing = [f for f in files if f not in have]
        assert not missing, f"{pkg} lacks {missing}; it has {sorted(have)}"
    # Every module of the source package is installed: the list comes from the source directory, so a new
    # module cannot be forgotten again (feed/dlpack.py, the GPU path, once was).
    pkg = "/usr/lib/python3/dist-packages/feed/"
    have = {f[len(pkg):] for f in contents(deb(debs, "python3-feed")) if f.startswith(pkg) and f.endswith(".py")}
    want = {p.name for p in (SRC / "client" / "python" / "feed").glob("*.py")}
    assert want and have == want | {"_installed.py"}, f"python3-feed has {sorted(have)}, the source {sorted(want)}"
    # The shared object is in the runtime package only, the link in -dev only.
    assert not any(f.endswith(".h") or f.endswith("/libfeed.so") for f in contents(deb(debs, "libfeed0")))
    assert not any(".so.0" in f for f in contents(deb(debs, "libfeed-dev")))


def test_control_data(debs):
    feedd = deb(debs, "feedd")
    info = run(["dpkg-deb", "-I", feedd]).stdout
    assert re.search(r"^ Package: feedd$", info, re.M), info
    depends = field(feedd, "Depends")
    assert re.search(r"\blibfeed0 \(>= ", depends), depends
    assert "systemd-sysusers" in depends, depends
    assert re.fullmatch(r"libfeed0 \(= [^)]+\)", field(deb(debs, "libfeed-dev"), "Depends").split(",")[0])
    py = field(deb(debs, "python3-feed"), "Depends")
    assert "python3-numpy" in py and re.search(r"\blibfeed0 \(= ", py) and re.search(r"\bpython3\b", py), py
    assert field(deb(debs, "libfeed0"), "Multi-Arch") == "same"

    ctl = debs / "control-feedd"
    run(["dpkg-deb", "-e", feedd, ctl])
    assert (ctl / "conffiles").read_text().split() == ["/etc/feedd/feedd.conf"]
    postinst = (ctl / "postinst").read_text()
    # The user exists before the units that name it are enabled and started.
    assert postinst.index("systemd-sysusers") < postinst.index("deb-systemd-helper enable 'feedd.socket'")
    assert "deb-systemd-invoke" in postinst
    # An upgrade does not stop the daemon under running training jobs.
    prerm = (ctl / "prerm").read_text()
    assert re.search(r'"\$1" = remove', prerm) and "upgrade" not in prerm, prerm

    shlibs = debs / "control-libfeed0"
    run(["dpkg-deb", "-e", deb(debs, "libfeed0"), shlibs])
    # Every exported function is in the symbols file, under the version node
    # of client/libfeed.sym, so dependent packages get the right minimum version.
    exported = set(re.findall(r"^\s+(feed_\w+);", (SRC / "client" / "libfeed.sym").read_text(), re.M))
    listed = re.findall(r"^ (\w+)@([\w.]+) ", (shlibs / "symbols").read_text(), re.M)
    assert {name for name, node in listed if node == "LIBFEED_0.1" and name != "LIBFEED_0.1"} == exported, listed


def test_lintian_has_no_errors(debs):
    need("lintian")
    changes = debs / f"feedd_{VERSION}_{ARCH}.changes"
    p = run(["lintian", "--no-tag-display-limit", changes], check=False)
    tags = [ln for ln in p.stdout.splitlines() if re.match(r"^[EW]: ", ln)]
    print("\n".join(tags) or "lintian: no errors or warnings")
    errors = [t for t in tags if t.startswith("E: ")]
    assert not errors and p.returncode == 0, p.stdout + p.stderr


@pytest.fixture(scope="module")
def root(debs, tmp_path_factory):
    """feedd, libfeed0, libfeed-dev and python3-feed unpacked into one directory."""
    r = tmp_path_factory.mktemp("root")
    for pkg in ("feedd", "libfeed0", "libfeed-dev", "python3-feed"):
        run(["dpkg-deb", "-x", deb(debs, pkg), r])
    return r


def test_packaged_programs_serve_a_feed(root, tmp_path):
    """The packaged feedd, started with the packaged config plus one feed,
    serves batches that the packaged feedctl and Python package read through
    the packaged libfeed."""
    sys.path.insert(0, str(SRC / "scripts"))
    import gen_megatron
    ma = multiarch()
    libdir = root / "usr" / "lib" / ma
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    env.pop("FEEDD_BUILD_DIR", None)
    env.pop("FEEDD_SOCKET", None)
    feedd, feedctl = root / "usr/sbin/feedd", root / "usr/bin/feedctl"
    assert run([feedd, "--version"], env=env).stdout.strip() == f"feedd {VERSION}"
    ldd = run(["ldd", feedctl], env=env).stdout
    assert str(libdir / "libfeed.so.0") in ldd, ldd

    doc = list(range(100, 140))
    gen_megatron.write_shard(str(tmp_path / "shard_000"), [[doc]])
    conf = tmp_path / "feedd.conf"
    conf.write_text((root / "etc/feedd/feedd.conf").read_text() +
                    f"\n[feed.web]\nshards = {tmp_path}/shard_*.idx\nseq_len = 8\nbatch_size = 2\nshuffle = false\n")
    check = run([feedd, "-c", conf, "--check"], env=env)
    assert check.stdout.strip() == f"{conf}: 1 feeds, 0 failed", check.stdout

    sock = tmp_path / "feedd.sock"
    log = open(tmp_path / "feedd.log", "w")
    proc = subprocess.Popen([feedd, "-c", conf, "-s", sock], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 20
        while not sock.exists():
            assert proc.poll() is None, (tmp_path / "feedd.log").read_text()
            assert time.time() < deadline, "packaged feedd did not create its socket"
            time.sleep(0.05)
        status = json.loads(run([feedctl, "-s", sock, "status", "--json"], env=env).stdout)
        assert status["daemon"]["version"] == VERSION
        assert [f["name"] for f in status["feeds"]] == ["web"]

        code = (
            "import feed, numpy\n"
            f"l = feed.Loader('web', rank=0, world_size=1, socket={str(sock)!r}, as_numpy=True)\n"
            "b = next(iter(l))\n"
            "print([ln.split()[-1] for ln in open('/proc/self/maps') if 'libfeed.so' in ln][0])\n"
            "print(numpy.asarray(b['input_ids']).reshape(-1).tolist())\n"
            "import importlib.metadata as m; print(m.version('feed'), feed.__version__)\n"
            "l.close()\n")
        penv = dict(env, PYTHONPATH=str(root / "usr/lib/python3/dist-packages"))
        out = run([sys.executable, "-c", code], env=penv, cwd=tmp_path).stdout.splitlines()
        # The packaged library, not one from the build tree or the system.
        assert out[0].startswith(str(libdir) + "/libfeed.so.0"), out
        # shuffle = false, one document: the first batch is its first 2 x 8 tokens.
        assert out[1] == str(doc[:16]), out
        assert out[2] == f"{VERSION} {VERSION}", out  # importlib.metadata sees the Debian install too
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, (tmp_path / "feedd.log").read_text()


def test_libfeed_dev_builds_a_client(root, tmp_path):
    """A program compiles and links against the packaged header and libfeed.pc."""
    need("cc", "pkg-config")
    ma = multiarch()
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=str(root),
               PKG_CONFIG_LIBDIR=str(root / "usr/lib" / ma / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "libfeed"], env=env).stdout.split()
    assert f"-L{root}/usr/lib/{ma}" in flags and "-lfeed" in flags, flags
    src = tmp_path / "client.c"
    src.write_text('#include <errno.h>\n#include <stdio.h>\n#include <feed/feed.h>\n'
                   'int main(void)\n{\n\tfeed_client *c;\n'
                   '\tint r = feed_client_connect("/nonexistent/feedd.sock", &c);\n'
                   '\tprintf("%d %s\\n", r, feed_strerror(r));\n\treturn r == -ENOENT ? 0 : 1;\n}\n')
    exe = tmp_path / "client"
    run(["cc", "-Wall", "-Werror", src, "-o", exe] + flags)
    p = run([exe], env=dict(os.environ, LD_LIBRARY_PATH=str(root / "usr/lib" / ma)))
    assert p.stdout.startswith(f"-{2} "), p.stdout
