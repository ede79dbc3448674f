"""Child processes of the benchmark: started on loopback, waited on with a deadline, stopped by PID.

The test suite has its own helper (`tests/kvtest/procs.py`); the library cannot import test
code, so the drivers use this small owner instead. A `Child` drains its merged stdout/stderr on
a thread (a full pipe would stall a chatty server such as mooncake_master), can wait for a line
or for a TCP port, and `stop()` sends SIGTERM then SIGKILL to its own PID only.

Children also get `PR_SET_PDEATHSIG`, so that a benchmark killed with SIGKILL (no `finally`
runs) does not leave a Redis or a Mooncake master behind. It is set by a few lines of Python
that then exec the real program (the signal survives exec), not by `preexec_fn`, which runs
Python in a forked copy of a multi-threaded process and can deadlock there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from kvpool.bench.peers.base import BenchError

__all__ = ["Child", "free_port", "wait_port"]

# argv: PARENT_PID PROGRAM ARGS...; prctl(PR_SET_PDEATHSIG=1, SIGTERM=15), then exec. If the
# parent is already gone (its PID is no longer our parent), exit instead of running orphaned.
_LAUNCHER = (
    "import ctypes, os, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, 15)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float, child: Child | None = None) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; `BenchError` at `deadline`."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            pass
        if child is not None and not child.alive():
            raise BenchError(f"{child.name} exited before listening; output:\n{child.output()}")
        if time.monotonic() > deadline:
            raise BenchError(f"nothing listens on 127.0.0.1:{port} after the start-up deadline")
        time.sleep(0.05)  # polling a port; there is nothing to wait on instead


class Child:
    """One child process, its output drained into memory, stopped by `stop()` (idempotent)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        name: str = "",
        env: dict[str, str] | None = None,
        stdin: bool = False,
    ) -> None:
        self.name = name or os.path.basename(args[0])
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        argv = list(args)
        if sys.platform == "linux":
            argv = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *argv]
        self._popen = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=full_env,
            text=True,
            bufsize=1,
            # Its own session: a Ctrl-C at the terminal reaches only us, and our `finally`
            # stops the children in order (clients before the servers they talk to).
            start_new_session=True,
        )
        self._lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"bench-{self.name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    def _read(self) -> None:
        out = self._popen.stdout
        assert out is not None
        for raw in out:
            line = raw.rstrip("\n")
            self._lines.append(line)
            del self._lines[:-400]  # bounded: only the tail is ever shown
            self._queue.put(line)
        self._queue.put(None)

    def alive(self) -> bool:
        return self._popen.poll() is None

    def output(self) -> str:
        return "\n".join(self._lines[-60:])

    def wait_line(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first output line matching `pattern`; `BenchError` on exit or timeout."""
        rx = re.compile(pattern)
        for line in list(self._lines):
            if m := rx.search(line):
                return m
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(
                    f"{self.name}: no line matching {pattern!r} in {timeout} s:\n{self.output()}"
                )
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if item is None:
                raise BenchError(
                    f"{self.name} exited ({self._popen.wait()}) before printing {pattern!r}:\n"
                    + self.output()
                )
            if m := rx.search(item):
                return m

    def close_stdin(self) -> None:
        """Tell a child that waits on stdin to finish (how the Mooncake node is asked to leave)."""
        if self._popen.stdin is not None and not self._popen.stdin.closed:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM (or EOF on stdin), then SIGKILL after `grace` s; the exit code."""
        if self._popen.poll() is None:
            try:
                if self._popen.stdin is not None:
                    self.close_stdin()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._popen.wait(timeout=grace)
                if self._popen.poll() is None:
                    os.kill(self._popen.pid, signal.SIGTERM)
                    self._popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.kill(self._popen.pid, signal.SIGKILL)
                self._popen.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.close_stdin()
        self._reader.join(timeout=5)
        if self._popen.stdout is not None:
            self._popen.stdout.close()
        return self._popen.returncode
