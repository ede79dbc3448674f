"""Start real kvpool (or other) processes for tests, wait on what they print, always stop them.

Convention: every kvpool server command prints one line containing `listening on HOST:PORT`
to stdout (flushed) once it serves, so tests bind port 0 and learn the port from that line.
Processes are stopped by their own PID (SIGTERM, then SIGKILL after a grace period). `Proc` is
the library's `kvpool.children.Child` (death signal, own session, output drained on a thread)
with the tests' conventions: it keeps every line and a wait that fails is an `AssertionError`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvpool.children import READY_RE, Child, ChildError, free_port
from kvpool.override import override

__all__ = [
    "READY_RE",
    "Proc",
    "free_port",
    "freeze",
    "kvpool_proc",
    "kvpool_up",
    "require_binary",
    "run_kvpool",
    "wait_until",
]

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)
        last = predicate()
    return last


def _all_threads_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                # The state follows the command name, which is in parentheses and may hold spaces.
                state = f.read().rpartition(")")[2].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t"):
            return False
    return True


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and return once every one of its threads is stopped.

    `kill` only queues the signal: a thread running on another core may go on serving for a
    moment, so a test that freezes a peer and then expects it to answer nothing must wait here.
    """
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: _all_threads_stopped(pid), timeout, what=f"process {pid} to stop")


class Proc(Child):
    """A `kvpool.children.Child` for tests: every output line kept, waits fail as assertions."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None, name: str = ""):
        super().__init__(args, name=name, env=env, max_lines=None)

    def wait_for_line(self, pattern: str | re.Pattern[str], timeout: float = 20.0) -> re.Match[str]:
        """The first output line (seen so far or later) that matches `pattern`."""
        try:
            return self.wait_line(pattern, timeout)
        except ChildError as exc:
            raise AssertionError(exc.message) from None

    @override
    def wait_ready(self, timeout: float = 20.0) -> str:
        """Wait for the `listening on HOST:PORT` line; returns "HOST:PORT"."""
        m = self.wait_for_line(READY_RE, timeout)
        return f"{m.group(1)}:{m.group(2)}"

    @override
    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after `grace` s; returns the exit code. Idempotent."""
        code = super().stop(grace)
        assert code is not None
        return code

    @override
    def __enter__(self) -> Proc:
        return self


def kvpool_proc(*args: str, env: dict[str, str] | None = None, name: str = "") -> Proc:
    """`python -m kvpool ARGS...` as a child process."""
    return Proc([sys.executable, "-m", "kvpool", *args], env=env, name=name or f"kvpool {args[0]}")


def kvpool_up(*args: str, segment_size: str = "16MiB") -> Proc:
    """`kvpool up --port 0 --segment-size SIZE ARGS...` (a master and one node) as a child."""
    return kvpool_proc("up", "--port", "0", "--segment-size", segment_size, *args, name="up")


def run_kvpool(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m kvpool ARGS...` run to its end (`timeout` s at most), its output captured;
    `env` replaces the environment when given."""
    return subprocess.run(
        [sys.executable, "-m", "kvpool", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def require_binary(name: str) -> str:
    """Path of an external server binary; skip the test without it, fail when CI requires it."""
    import shutil

    import pytest

    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path is None:
        if os.environ.get("KVPOOL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{name} is required (KVPOOL_REQUIRE_SERVICES=1) but not installed")
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path
