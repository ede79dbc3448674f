"""The embedded pool: a master and one storage node as child processes, owned by one object.

`kvpool up`, `kvpool demo`, the store benchmark and tests need a whole pool on one machine. Rather
than re-implementing the master in-process, `EmbeddedPool` runs the very commands a deployment
runs (`kvpool master`, `kvpool node`) as children, learns their ports from the `listening on
HOST:PORT` line each prints, and stops them in the right order: the node first (so it unmounts
cleanly and removes its segment), then the master.

Nothing outlives the owner: `close()` is idempotent and runs from `__exit__`; each child is in its
own session (a Ctrl-C at the terminal reaches only the owner, which then stops the children in
order) and gets SIGTERM from the kernel if the owner dies without closing (PR_SET_PDEATHSIG).
The kernel ties that signal to the *thread* that started the child, so start the pool from a
thread that outlives it (the main thread, as the commands and tests do).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool.config import format_size, parse_duration, parse_size
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["ChildProcess", "EmbeddedPool", "PoolSpec"]

log = logging.getLogger(__name__)

_READY = re.compile(r"listening on (\S+):(\d+)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the parent thread exits (Linux only)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """One `python -m kvpool ...` child whose output lines are collected by a reader thread.

    `on_line`, if given, sees every line (the reader thread calls it; keep it short).
    """

    def __init__(
        self,
        args: Sequence[str],
        name: str,
        on_line: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.lines: deque[str] = deque(maxlen=500)
        self._on_line = on_line
        self._ready = threading.Event()
        self._address: str | None = None
        full_env = dict(os.environ)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "kvpool", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        self._reader = threading.Thread(target=self._read, name=f"child-{name}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            if self._address is None:
                m = _READY.search(line)
                if m:
                    self._address = f"{m.group(1)}:{m.group(2)}"
                    self._ready.set()
            if self._on_line is not None:
                self._on_line(line)
        self._ready.set()  # exited: wake a waiter, which sees no address

    def wait_ready(self, timeout: float) -> str:
        """The HOST:PORT of the child's `listening on` line; raises if it exits or times out."""
        if not self._ready.wait(timeout) or self._address is None:
            code = self.popen.poll()
            why = f"exited with {code}" if code is not None else f"not ready after {timeout} s"
            raise KVPoolError(f"{self.name} {why}; its output:\n" + self.output())
        return self._address

    def output(self) -> str:
        return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` s. Idempotent; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning(
                    "%s (pid %d) ignored SIGTERM for %.0f s; killing", self.name, self.pid, grace
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the embedded pool runs."""

    segment_size: int = 1 << 30
    """Bytes of the node's segment (0: a master without a node)."""
    nodes: int = 1
    """Storage nodes to start, each with `segment_size` bytes."""
    host: str = "127.0.0.1"
    """Address the master and the nodes bind."""
    port: int = 0
    """Master port (0: any free port)."""
    client_ttl: float | None = None
    """Seconds without a ping before the master drops a client (None: the master's default)."""
    master_args: tuple[str, ...] = ()
    """Extra `kvpool master` arguments."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "segment_size", parse_size(self.segment_size, name="segment_size"))
        if not 0 <= self.port <= 65535:
            raise InvalidParams(f"port: {self.port} is not a TCP port")
        if self.nodes < 0:
            raise InvalidParams(f"nodes: {self.nodes} is negative")
        if self.client_ttl is not None:
            object.__setattr__(
                self, "client_ttl", parse_duration(self.client_ttl, name="client_ttl", minimum=0.1)
            )


class EmbeddedPool:
    """A master plus `spec.nodes` storage nodes as child processes; `.address` is the master's.

    Use as a context manager, or call `start()` and `close()` yourself.
    """

    def __init__(self, spec: PoolSpec | None = None, *, ready_timeout: float = 120.0) -> None:
        self.spec = spec or PoolSpec()
        self.ready_timeout = ready_timeout
        self.master: ChildProcess | None = None
        self.nodes: list[ChildProcess] = []
        self.node_endpoints: list[str] = []
        self._address: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def address(self) -> str:
        if self._address is None:
            raise KVPoolError("the embedded pool is not started")
        return self._address

    def start(self, on_node_line: Callable[[str], None] | None = None) -> str:
        """Start the master, then the nodes; returns the master's HOST:PORT."""
        spec = self.spec
        args = ["master", "--host", spec.host, "--port", str(spec.port)]
        if spec.client_ttl is not None:
            args += ["--client-ttl", f"{spec.client_ttl}s"]
        args += list(spec.master_args)
        try:
            self.master = ChildProcess(args, name="kvpool master")
            self._address = self.master.wait_ready(self.ready_timeout)
            for i in range(spec.nodes if spec.segment_size > 0 else 0):
                self.add_node(spec.segment_size, name=f"kvpool node {i}", on_line=on_node_line)
        except BaseException:
            self.close()
            raise
        log.info(
            "embedded pool at %s: %d node(s) of %s",
            self._address,
            len(self.nodes),
            format_size(spec.segment_size),
        )
        return self._address

    def add_node(
        self, segment_size: int, name: str = "", on_line: Callable[[str], None] | None = None
    ) -> ChildProcess:
        """Start one more `kvpool node` of `segment_size` bytes and wait until it has mounted."""
        node = ChildProcess(
            [
                "node",
                "--master",
                self.address,
                "--segment-size",
                str(segment_size),
                "--host",
                self.spec.host,
            ],
            name=name or f"kvpool node {len(self.nodes)}",
            on_line=on_line,
        )
        with self._lock:
            self.nodes.append(node)
        self.node_endpoints.append(node.wait_ready(self.ready_timeout))
        return node

    def alive(self) -> bool:
        return (
            self.master is not None and self.master.alive() and all(n.alive() for n in self.nodes)
        )

    def close(self) -> None:
        """Stop the nodes (they unmount), then the master. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            nodes, self.nodes = list(self.nodes), []
        deadline = time.monotonic() + 30
        for node in nodes:
            node.stop(grace=max(1.0, deadline - time.monotonic()))
        if self.master is not None:
            self.master.stop()

    def __enter__(self) -> EmbeddedPool:
        if self._address is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
