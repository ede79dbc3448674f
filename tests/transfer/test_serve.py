"""`python -m kvpool.transfer.serve`: the peer process of tests and benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from kvtest.procs import wait_until


def test_sigterm_closes_the_segment_and_exits_cleanly(spawn_peer: Callable[..., Any]) -> None:
    peer = spawn_peer("term", "1MiB")
    path = peer.location.shm_path
    assert os.path.exists(path)
    assert peer.proc.stop() == 0
    assert not os.path.exists(path)


def test_stdin_eof_stops_a_watching_peer() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvpool.transfer.serve", "--size", "1MiB", "--watch-stdin"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert "listening on 127.0.0.1:" in proc.stdout.readline()
        proc.stdin.close()
        wait_until(lambda: proc.poll() is not None, timeout=20, what="the peer to exit")
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
