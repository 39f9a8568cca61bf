# SPDX-License-Identifier: MIT
"""Entry of suite 'gpu': runs test_gpu.py where a CUDA device and a GPU-staging feedd exist, else exits 77."""

import os
import subprocess
import sys
from pathlib import Path


def skip(why):
    print(f"gpu: skipped: {why}")
    sys.exit(77)


try:
    import torch
except ImportError:
    skip("no torch")
if not torch.cuda.is_available():
    skip("no CUDA device (torch.cuda.is_available() is False)")
build = Path(os.environ.get("FEEDD_BUILD_DIR", "build"))
if "#define HAVE_CUDA 1" not in (build / "config.h").read_text():
    skip("feedd was built without CUDA (meson -Dcuda)")
here = Path(__file__).resolve().parent
sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "test_gpu.py")]))
