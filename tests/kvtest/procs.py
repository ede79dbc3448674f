"""Start real kvpool (or other) processes for tests, wait on what they print, always stop them.

Convention: every kvpool server command prints one line containing `listening on HOST:PORT`
to stdout (flushed) once it serves, so tests bind port 0 and learn the port from that line.
Processes are stopped by their own PID (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

READY_RE = re.compile(r"listening on (\S+):(\d+)")


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


class Proc:
    """A child process whose stdout (and stderr, merged) lines are collected by a thread."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None, name: str = ""):
        self.name = name or os.path.basename(args[0])
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self.popen = subprocess.Popen(
            list(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read, name=f"proc-reader-{self.name}", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def wait_for_line(self, pattern: str | re.Pattern[str], timeout: float = 20.0) -> re.Match[str]:
        """The first output line (seen so far or later) that matches `pattern`."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        for line in list(self.lines):
            m = rx.search(line)
            if m:
                return m
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{self.name}: no line matching {rx.pattern!r} in {timeout} s; output:\n"
                    + self.output()
                )
            try:
                item = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if item is None:
                raise AssertionError(
                    f"{self.name} exited ({self.popen.wait()}) before printing {rx.pattern!r}; output:\n"
                    + self.output()
                )
            m = rx.search(item)
            if m:
                return m

    def wait_ready(self, timeout: float = 20.0) -> str:
        """Wait for the `listening on HOST:PORT` line; returns "HOST:PORT"."""
        m = self.wait_for_line(READY_RE, timeout)
        return f"{m.group(1)}:{m.group(2)}"

    def output(self) -> str:
        return "\n".join(self.lines[-200:])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, grace: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after `grace` s; returns the exit code. Idempotent."""
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
            except ProcessLookupError:
                pass
        self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kvpool_proc(*args: str, env: dict[str, str] | None = None, name: str = "") -> Proc:
    """`python -m kvpool ARGS...` as a child process."""
    return Proc([sys.executable, "-m", "kvpool", *args], env=env, name=name or f"kvpool {args[0]}")


def free_port() -> int:
    """A port that was free a moment ago (for servers such as redis that cannot bind port 0)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
