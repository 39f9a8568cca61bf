# SPDX-License-Identifier: MIT
"""Connections feedd refuses at connect time reach the caller with the daemon's own reason.

A real feedd with max_connections = 1: while one client holds the only
connection, the next one is refused (-EUSERS) before its HELLO is answered.
libfeed's feed_client_connect_err(), the Python package and feedctl must all
say what the daemon said (which limit, how many connections), not only
"connection refused" or a bare errno.
"""

import ctypes
import errno
import os
import sys
import time

import pytest

from conftest import BUILD, SRC, feed_conf, open_fds

sys.path.insert(0, str(SRC / "client" / "python"))
os.environ.setdefault("FEEDD_BUILD_DIR", str(BUILD))
import feed  # noqa: E402
from feed import _lib  # noqa: E402


@pytest.fixture
def full(daemon, dataset):
    """A feedd whose only connection is taken by an attached client."""
    # admin_connections = 0: the tests run as root, which would otherwise get a slot kept for operators.
    d = daemon(feed_conf("web", f"{dataset}/shard_*.idx") + "\n[feedd]\nmax_connections = 1\nadmin_connections = 0\n")
    # The fixture's own probe connection may not be reaped yet: retry until the slot is ours.
    deadline = time.monotonic() + 10
    while True:
        try:
            holder = feed.Loader("web", rank=0, world_size=1, socket=d.socket, as_numpy=True)
            next(holder)
            break
        except feed.FeedError as e:
            if e.code != -errno.EUSERS or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield d
    holder.close()


def connect_err(sock):
    lib = _lib.lib
    ptr = ctypes.c_void_p()
    why = ctypes.create_string_buffer(512)
    r = lib.feed_client_connect_err(sock.encode(), why, len(why), ctypes.byref(ptr))
    if r == 0:
        lib.feed_client_close(ptr)
    return r, why.value.decode()


def test_libfeed_carries_the_daemons_reason(full):
    base = open_fds(os.getpid())
    r, why = connect_err(full.socket)
    assert r == -errno.EUSERS
    assert why == ("feedd has reached max_connections (1 connections); try again later, or raise max_connections "
                   "in the [feedd] section of feedd.conf"), why
    # A refused connect leaves nothing open in the caller.
    assert open_fds(os.getpid()) == base


def test_python_raises_with_the_daemons_reason(full):
    with pytest.raises(feed.FeedError, match=r"feedd has reached max_connections \(1 connections\)") as e:
        feed.Loader("web", rank=0, world_size=1, socket=full.socket)
    assert e.value.code == -errno.EUSERS


def test_feedctl_prints_the_daemons_reason(full):
    p = full.ctl("status", check=False)
    assert p.returncode != 0
    assert "feedd has reached max_connections (1 connections); try again later" in p.stderr, p.stderr


def test_no_daemon_is_still_named(tmp_path):
    r, why = connect_err(str(tmp_path / "nothere.sock"))
    assert r == -errno.ENOENT
    assert why.startswith(f"cannot reach feedd at {tmp_path / 'nothere.sock'}: "), why
