"""Child processes: started to die with their owner, drained on a thread, stopped by their PID.

The one way kvpool runs another program: the embedded pool (`kvpool.client.embedded`), the
benchmarks (`kvpool.bench`) and the test fixtures (`tests/kvtest/procs.py`) all start their
children through `Child`.

* **Death signal.** On Linux a child gets `PR_SET_PDEATHSIG` (SIGTERM), so an owner killed with
  SIGKILL (no `finally` runs) leaves no master, node or Redis behind. It is set by a few lines of
  Python (`_LAUNCHER`) that then exec the real program: the signal survives exec, and the PID the
  owner holds is the program's own. It is never set by `preexec_fn`, which runs Python in the
  forked copy of a process that may already run threads (a Store, a bench's reader threads) and
  can deadlock there on a lock another thread held at fork time. The kernel ties the signal to
  the *thread* that started the child: start children from a thread that outlives them (the
  main thread, as the commands and tests do).
* **Own session.** A Ctrl-C at the terminal reaches only the owner, whose `finally` then stops
  the children in order (clients before the servers they talk to).
* **Output.** Merged stdout/stderr is read line by line on a thread (a full pipe would stall a
  chatty server), kept in `lines` (the last `max_lines`), and offered to `on_line`.
* **Waiting.** `wait_line` (a regex), `wait_ready` (the `listening on HOST:PORT` line every kvpool
  server prints) and `wait_port` (a TCP port, for servers that print nothing useful), each with a
  deadline; a child that exits first fails the wait at once. Failures raise `ChildError` with the
  child's last output.
* **Stopping.** `stop()` is idempotent: EOF on stdin (when the child was given one), then SIGTERM,
  then SIGKILL after `grace` seconds, always to the child's own PID, never to a group or a name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from kvpool.errors import KVPoolError

__all__ = ["READY_RE", "Child", "ChildError", "free_port", "launcher_argv", "wait_port"]

log = logging.getLogger(__name__)

READY_RE = re.compile(r"listening on (\S+):(\d+)")
"""The line every kvpool server prints once it serves (groups: host, port)."""

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


class ChildError(KVPoolError):
    """A child exited, or printed nothing expected, before its deadline (message: its output)."""


def launcher_argv(args: Sequence[str]) -> list[str]:
    """`args` behind the death-signal launcher (Linux), or unchanged elsewhere.

    `-S -E`: the launcher needs neither site-packages nor the caller's PYTHON* variables (the
    program it execs still gets the whole environment).
    """
    if sys.platform != "linux":
        return list(args)
    return [sys.executable, "-S", "-E", "-c", _LAUNCHER, str(os.getpid()), *args]


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, deadline: float, child: Child | None = None) -> None:
    """Return once 127.0.0.1:`port` accepts a connection; `ChildError` at `deadline`
    (`time.monotonic()`), or as soon as `child` has exited."""
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            pass
        if child is not None and not child.alive():
            raise ChildError(f"{child.name} exited before listening; output:\n{child.output()}")
        if time.monotonic() > deadline:
            raise ChildError(f"nothing listens on 127.0.0.1:{port} after the start-up deadline")
        time.sleep(0.05)  # polling a port; there is nothing to wait on instead


class Child:
    """One child process with its merged output drained on a thread; `stop()` ends it.

    `args` is the program and its arguments (`[sys.executable, "-m", "kvpool", ...]` for a
    kvpool server). `env` adds to this process's environment (`PYTHONUNBUFFERED=1` is always
    set). `stdin=True` gives the child a pipe that `close_stdin()` / `stop()` close (how a child
    that waits on EOF is asked to leave). `on_line` sees every output line, on the reader thread
    (keep it short). `max_lines` bounds `lines` (None: keep all, as tests that search the whole
    output do). `die_with_parent=False` skips the death-signal launcher.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        name: str = "",
        env: dict[str, str] | None = None,
        stdin: bool = False,
        on_line: Callable[[str], None] | None = None,
        max_lines: int | None = 500,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name or os.path.basename(args[0])
        self.lines: list[str] = []
        """The output lines read so far (the last `max_lines` of them)."""
        self._max_lines = max_lines
        self._count = 0  # lines ever read; lines[0] is line number _count - len(lines)
        self._eof = False
        self._cond = threading.Condition()
        self._on_line = on_line
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self.popen = subprocess.Popen(
            launcher_argv(args) if die_with_parent else list(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=full_env,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"child-{self.name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        out = self.popen.stdout
        assert out is not None
        try:
            for raw in out:
                line = raw.rstrip("\n")
                with self._cond:
                    self.lines.append(line)
                    self._count += 1
                    cap = self._max_lines
                    if cap is not None and len(self.lines) > 2 * cap:
                        del self.lines[:-cap]  # amortized: trimmed once per `cap` lines
                    self._cond.notify_all()
                if self._on_line is not None:
                    self._on_line(line)
        except (OSError, ValueError):  # the pipe was closed under us by stop()
            pass
        finally:
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self, last: int = 200) -> str:
        """The last `last` output lines, one string."""
        with self._cond:
            return "\n".join(self.lines[-last:])

    def wait_line(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first output line, read so far or later, that matches `pattern`.

        `ChildError` when the child's output ends (it exited) or `timeout` s pass first.
        """
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0  # line number of the next line to look at
        with self._cond:
            while True:
                first = self._count - len(self.lines)
                for line in self.lines[max(0, seen - first) :]:
                    if m := rx.search(line):
                        return m
                seen = self._count
                if self._eof:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = "\n".join(self.lines[-200:])
                    raise ChildError(
                        f"{self.name}: no line matching {rx.pattern!r} in {timeout} s; "
                        f"its output:\n{tail}"
                    )
                self._cond.wait(left)
        code: int | None = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.popen.wait(timeout=5)
        raise ChildError(
            f"{self.name} exited ({code}) before printing {rx.pattern!r}; its output:\n"
            + self.output()
        )

    def wait_ready(self, timeout: float) -> str:
        """The HOST:PORT of the child's `listening on HOST:PORT` line (`ChildError` if none)."""
        m = self.wait_line(READY_RE, timeout)
        return f"{m.group(1)}:{m.group(2)}"

    def close_stdin(self) -> None:
        """EOF on the child's stdin, if it has one (idempotent)."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def kill9(self) -> None:
        """SIGKILL now (a crash, for tests); waits for the exit."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, grace: float = 5.0) -> int | None:
        """EOF on stdin (if given one), SIGTERM, then SIGKILL after `grace` s; the exit code.

        Idempotent; signals go to the child's own PID only.
        """
        if self.popen.poll() is None:
            try:
                if self.popen.stdin is not None:
                    self.close_stdin()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.popen.wait(timeout=grace)
                if self.popen.poll() is None:
                    os.kill(self.popen.pid, signal.SIGTERM)
                    self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s (pid %d) ignored SIGTERM for %.0f s; killing", self.name, self.pid, grace
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.close_stdin()
        self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
