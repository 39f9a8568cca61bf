# SPDX-License-Identifier: MIT
"""Device batches on a real GPU: feedd and its client as two real processes.

Run by tests/gpu/run.py (suite 'gpu'), which exits 77 without a GPU.
- the CUDA tensors a client gets equal the host batches bit for bit, for
  thousands of batches, while a consumer kernel runs on the client's stream;
- a client SIGKILLed mid-batch loses nothing for others, and feedd releases
  its device buffers and events (fds back to where they were);
- a daemon that stops leaves a client that turned reconnecting off with a
  clear error, no hang, and a new feedd resumes the stream at the client's
  state_dict;
- with the default (reconnect), a client across a SIGKILL and restart of
  feedd imports the new daemon's buffers and events and reads on, its CUDA
  tensors equal to an undisturbed run's host batches (issue 17).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from conftest import BUILD, SRC, Daemon, daemon, dataset, feed_conf, open_fds  # noqa: E402,F401

os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
sys.path.insert(0, str(SRC / "client" / "python"))
import feed  # noqa: E402

KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens")


@pytest.fixture
def web(daemon, dataset):
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx", seq_len=256, batch_size=4, eos=50256))
    gpu = d.status()["daemon"]["gpu"]
    assert not gpu.startswith("unavailable"), f"feedd on a GPU machine has no GPU staging: {gpu}"
    # The first device attach creates feedd's CUDA context, which opens /dev/nvidia* and the runtime's
    # own fds for the rest of the process's life: warm up first, so base_fds counts only what a client
    # may leave behind.
    with feed.Loader("web", socket=d.socket, device="cuda:0") as ld:
        del ld
    deadline = time.time() + 10
    while d.status()["clients"] and time.time() < deadline:
        time.sleep(0.1)
    d.base_fds = open_fds(d.proc.pid)
    return d


def test_device_batches_equal_host_batches_under_load(web):
    n = 3000
    host = feed.Loader("web", socket=web.socket, rank=0, world_size=1, copy=True)
    dev = feed.Loader("web", socket=web.socket, rank=0, world_size=1, device="cuda:0")
    consumer = torch.cuda.Stream()
    load = torch.randn(2048, 2048, device="cuda:0")
    differing = torch.zeros((), dtype=torch.int64, device="cuda:0")
    with torch.cuda.stream(consumer):
        for i in range(n):
            b, h = next(dev), next(host)
            assert b["input_ids"].is_cuda and b["input_ids"].device.index == 0
            # A slow consumer kernel that reads the batch before it is released: a missing `ready` or
            # `release` wait would let the daemon's next copy overwrite it while it is read.
            torch.cuda._sleep(20000)
            load = load @ load * 1e-3 + b["input_ids"].float().mean()
            # Every element of every batch, compared on the GPU. The host copies are pinned and
            # non-blocking, so nothing here synchronises the consumer stream per batch.
            for k in KEYS:
                differing += (b[k] != h[k].pin_memory().to("cuda:0", non_blocking=True)).sum()
            del b, h
    torch.cuda.synchronize()
    assert differing.item() == 0, f"{differing.item()} elements of device batches differ from the host batches"
    dev.close()
    host.close()


CLIENT = textwrap.dedent("""
    import sys, time, feed, torch
    ld = feed.Loader("web", socket=sys.argv[1], device="cuda:0")
    # More batches than the ring has slots, each read by a long kernel: when the process dies, releases
    # recorded behind those kernels are still queued, and the daemon's copies wait on them.
    for _ in range(12):
        b = next(ld)
        torch.cuda._sleep(50_000_000)
        x = b["input_ids"].float().sum()
        del b
    held = [next(ld) for _ in range(2)]
    print("holding", flush=True)
    time.sleep(600)
""")


def test_client_killed_mid_batch(web):
    env = dict(os.environ, PYTHONPATH=str(SRC / "client" / "python"), FEEDD_BUILD_DIR=str(BUILD))
    p = subprocess.Popen([sys.executable, "-c", CLIENT, web.socket], stdout=subprocess.PIPE, env=env, text=True)
    assert p.stdout.readline().strip() == "holding"
    p.send_signal(signal.SIGKILL)
    p.wait()
    # feedd goes on serving device batches, and the dead client's buffers, events and fds are gone.
    with feed.Loader("web", socket=web.socket, device="cuda:0") as ld:
        for _ in range(50):
            b = next(ld)
            assert b["input_ids"].is_cuda
            del b
    deadline = time.time() + 10
    while open_fds(web.proc.pid) != web.base_fds and time.time() < deadline:
        time.sleep(0.2)
    assert open_fds(web.proc.pid) == web.base_fds
    assert web.status()["clients"] == []


def test_daemon_restart(daemon, dataset):
    conf = feed_conf("web", f"{dataset}/shard_*.idx", seq_len=256, batch_size=4, eos=50256)
    d = daemon(conf)
    ld = feed.Loader("web", socket=d.socket, device="cuda:0", timeout=30, reconnect_timeout=0)
    for _ in range(10):
        b = next(ld)
    state = ld.state_dict()
    want_next = b.index + 1
    del b
    assert d.stop() == 0
    t0 = time.time()
    with pytest.raises(feed.DaemonGoneError):
        for _ in range(100):
            next(ld)
    assert time.time() - t0 < 25, "the client must learn at once that feedd stopped, not hang"
    ld.close()
    d2 = daemon(conf)
    ld2 = feed.Loader("web", socket=d2.socket, device="cuda:0")
    ld2.load_state_dict(state)
    b = next(ld2)
    assert b.index == want_next and b["input_ids"].is_cuda
    del b
    ld2.close()


def test_daemon_killed_and_restarted_reimports(tmp_path, dataset):
    conf = feed_conf("web", f"{dataset}/shard_*.idx", seq_len=256, batch_size=4, eos=50256)
    d = Daemon(tmp_path, conf, name="feedd")
    try:
        ld = feed.Loader("web", socket=d.socket, device="cuda:0", timeout=30)  # reconnect_timeout: the default
        got = []
        for _ in range(6):
            b = next(ld)
            assert b["input_ids"].is_cuda
            got.append({k: b[k].cpu() for k in KEYS})
            del b
        d.proc.kill()
        d.proc.wait()
        d = Daemon(tmp_path, conf, name="feedd")  # the same socket
        for _ in range(20):
            b = next(ld)
            assert b["input_ids"].is_cuda, "the loader fell back to host batches after the reconnect"
            got.append({k: b[k].cpu() for k in KEYS})
            del b
        assert ld.stats()["reconnects"] == 1
        ld.close()
        with feed.Loader("web", socket=d.socket, copy=True) as ref:
            for i, g in enumerate(got):
                w = next(ref)
                for k in KEYS:
                    assert torch.equal(g[k], w[k]), f"batch {i}: {k} differs from the host batches"
    finally:
        d.stop()
