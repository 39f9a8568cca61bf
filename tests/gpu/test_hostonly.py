# SPDX-License-Identifier: MIT
"""Host-only mode, with a real feedd on a machine without a CUDA driver or device.

feedd must start, say why it has no GPU staging (the CUDA error text) in its
log and in status, keep serving host batches, refuse a device attach with
that reason, and give host batches to a client that allowed the fallback.
On a machine where feedd does have a GPU these tests skip (tests/gpu/ runs).
Runs with Debian's /usr/bin/python3 (python3-pytest, python3-torch).
"""

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from conftest import BUILD, SRC, daemon, dataset, feed_conf, open_fds  # noqa: E402,F401

os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
sys.path.insert(0, str(SRC / "client" / "python"))
import feed  # noqa: E402


@pytest.fixture
def web(daemon, dataset):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", seq_len=128, batch_size=2, eos=50256))
    gpu = d.status()["daemon"]["gpu"]
    if not gpu.startswith("unavailable: "):
        pytest.skip(f"feedd has GPU staging here ({gpu}); tests/gpu covers it")
    d.base_fds = open_fds(d.proc.pid)
    return d


def test_status_and_log_say_why_there_is_no_gpu(web):
    gpu = web.status()["daemon"]["gpu"]
    reason = gpu[len("unavailable: "):]
    assert reason, "host-only mode must say why"
    cuda_built = "#define HAVE_CUDA 1" in (BUILD / "config.h").read_text()
    if cuda_built:
        # The runtime's own words: this machine has the toolkit and no driver.
        assert "cudaError" in reason, f"the CUDA error is not named: {reason!r}"
    else:
        assert "built without CUDA" in reason
    assert f"gpu {gpu}" in web.ctl("status").stdout, "feedctl status shows the gpu line"
    assert f"gpu: {gpu}; serving host batches only" in web.log_text()


def test_device_attach_is_refused_with_the_reason(web):
    gpu = web.status()["daemon"]["gpu"]
    with pytest.raises(feed.DeviceUnavailableError) as e:
        feed.Loader("web", socket=web.socket, device="cuda:0")
    assert e.value.code is not None and e.value.code < 0
    assert "cuda:0" in str(e.value) and gpu[len("unavailable: "):] in str(e.value), str(e.value)
    # A refused device attach costs nothing: the daemon serves the next client and holds no extra fds.
    with feed.Loader("web", socket=web.socket, as_numpy=True) as ld:
        b = next(ld)
        assert b["input_ids"].shape == (2, 128)
        del b
    assert open_fds(web.proc.pid) == web.base_fds
    assert "refused" in web.log_text()


def test_fallback_gives_the_same_host_batches(web):
    want = []
    with feed.Loader("web", socket=web.socket, rank=1, world_size=2, as_numpy=True, copy=True) as ld:
        for _ in range(20):
            want.append(next(ld))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ld = feed.Loader("web", socket=web.socket, rank=1, world_size=2, device="cuda:0", allow_host_fallback=True)
    assert any("host batches instead" in str(x.message) for x in w), [str(x.message) for x in w]
    with ld:
        for i in range(20):
            b = next(ld)
            assert b["input_ids"].device.type == "cpu"
            for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
                assert np.array_equal(b[k].numpy(), want[i][k]), f"batch {i}: {k} differs"
            assert b.cursor == want[i].cursor
            del b
    assert open_fds(web.proc.pid) == web.base_fds


def test_device_argument_is_checked():
    with pytest.raises(ValueError):
        feed.Loader("web", device="tpu:0")


def test_feedd_needs_no_cuda_runtime_on_the_loader_path():
    """A driver-only GPU node has no libcudart.so on its loader path (PyTorch's
    wheels keep theirs in site-packages): feedd links the runtime statically, so
    it starts there and no program of the daemon's NEEDs libcudart."""
    import shutil
    import subprocess
    if not shutil.which("readelf"):
        pytest.skip("readelf (binutils) is not installed")
    for prog in (BUILD / "daemon" / "feedd", BUILD / "client" / "feedctl" / "feedctl"):
        dyn = subprocess.run(["readelf", "-d", str(prog)], capture_output=True, text=True, check=True).stdout
        needed = [l for l in dyn.splitlines() if "(NEEDED)" in l]
        assert needed, f"readelf found no NEEDED entries in {prog}"
        assert not any("libcudart" in l for l in needed), f"{prog} needs the CUDA runtime:\n" + "\n".join(needed)
    # And it runs with the toolkit's directories off the library path (a bundle's own lib/ stays).
    path = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d and "cuda" not in d.lower()]
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(path))
    r = subprocess.run([str(BUILD / "daemon" / "feedd"), "--version"], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
