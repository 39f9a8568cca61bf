# SPDX-License-Identifier: MIT
"""The examples, run as a user runs them, against a real feedd: torchrun with two ranks (torch 1.13's
torch.distributed.run, gloo, CPU), the Hugging Face Trainer example (its --standin mode: Debian 12 has no
transformers), and the Lightning DataModule (skipped where Lightning is not installed).

Run by the same interpreter as the tests (sys.executable): from the source tree, the examples fall back to
client/python; in tests/python/test_wheel.py's venv they import the installed package.
"""

import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import BUILD, SRC, feed_conf, gen_megatron

VOCAB = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("ex")
    gen_megatron.main([str(d), "--shards", "2", "--docs-per-shard", "60", "--mean-len", "50", "--vocab", str(VOCAB),
                       "--seed", "9", "--prefix", "e"])
    return d


@pytest.fixture
def web(daemon, data):
    return daemon(feed_conf("web", f"{data}/e*.idx", seq_len=64, batch_size=2, eos=VOCAB))


def env_for(web, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT",
                                                            "PYTHONPATH")}
    env.update(FEEDD_SOCKET=web.socket, FEEDD_BUILD_DIR=str(BUILD), OMP_NUM_THREADS="1", **kw)
    return env


def run_example(args, env, timeout=300):
    p = subprocess.run([sys.executable, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout,
                       cwd="/")
    assert p.returncode == 0, f"{args} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks(web):
    """examples/train_torch.py under torchrun: DDP over gloo, each rank its own feed.Loader."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        # scripts/sanitize.sh preloads ASan into Python: libtorch's own threads then abort in ASan's
        # __cxa_throw interceptor (a CHECK inside libtorch_cpu, before any feed code runs).
        pytest.skip("torch.distributed aborts inside libtorch under a preloaded ASan; the plain run covers it")
    out = run_example(["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                       "--master_addr", "127.0.0.1", "--master_port", free_port(),
                       # torch 1.13 on Python 3.11: --redirects 0 crashes in to_map() (docs/python.md).
                       "--redirects", "1", "--tee", "1",
                       SRC / "examples" / "train_torch.py", "--feed", "web", "--steps", "6", "--log-every", "3",
                       "--d-model", "32", "--vocab", VOCAB + 1], env_for(web))
    for r in (0, 1):
        assert re.search(rf"rank {r} step +6 +loss +\d+\.\d+", out), out
        assert re.search(rf"rank {r} done: libfeed saw 6 batches", out), out
    clients = {(c["rank"], c["world"]) for c in web.status()["clients"]}
    assert not clients, clients  # both ranks detached


def test_hf_trainer_example_with_the_standin_model(web):
    out = run_example([SRC / "examples" / "train_hf.py", "--standin", "--feed", "web", "--steps", "12",
                       "--log-every", "4", "--vocab", VOCAB + 1], env_for(web))
    # Trainer's model(**inputs): exactly the HF keys, int64, from the DataLoader's collate_fn.
    assert "inputs: input_ids (2, 64) torch.int64, labels (2, 64) torch.int64, position_ids (2, 64) torch.int64" \
        in out, out
    losses = [float(x) for x in re.findall(r"step \d+ loss (\d+\.\d+)", out)]
    assert len(losses) == 3 and all(0 < x < 20 for x in losses), out


def test_lightning_datamodule_example(web):
    try:
        __import__("lightning.pytorch")
    except ImportError:
        try:
            __import__("pytorch_lightning")
        except ImportError:
            pytest.skip("PyTorch Lightning is not installed (Debian 12 has no package for it); "
                        "examples/lightning_datamodule.py is not run")
    out = run_example([SRC / "examples" / "lightning_datamodule.py", "--feed", "web", "--steps", "5",
                       "--vocab", VOCAB + 1], env_for(web))
    assert "done: 5 steps" in out, out
