"""The embedded pool: a master and one storage node as child processes, owned by one object.

`kvpool up`, `kvpool demo`, the store benchmark and tests need a whole pool on one machine. Rather
than re-implementing the master in-process, `EmbeddedPool` runs the very commands a deployment
runs (`kvpool master`, `kvpool node`) as children, learns their ports from the `listening on
HOST:PORT` line each prints, and stops them in the right order: the node first (so it unmounts
cleanly and removes its segment), then the master.

Nothing outlives the owner: `close()` is idempotent and runs from `__exit__`; each child is a
`kvpool.children.Child`, in its own session (a Ctrl-C at the terminal reaches only the owner,
which then stops the children in order) and sent SIGTERM by the kernel if the owner dies without
closing (PR_SET_PDEATHSIG, set without `preexec_fn`: see `kvpool.children`). The kernel ties that
signal to the *thread* that started the child, so start the pool from a thread that outlives it
(the main thread, as the commands and tests do).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool.children import Child
from kvpool.config import format_size, parse_duration, parse_size
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["EmbeddedPool", "PoolSpec"]

log = logging.getLogger(__name__)


def _kvpool_child(
    args: Sequence[str], name: str, on_line: Callable[[str], None] | None = None
) -> Child:
    """`python -m kvpool ARGS...` as a `Child` (death signal, own session, output drained)."""
    return Child([sys.executable, "-m", "kvpool", *args], name=name, on_line=on_line)


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
    node_args: tuple[str, ...] = ()
    """Extra `kvpool node` arguments (e.g. `--offload-dir PATH`)."""

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
        self.master: Child | None = None
        self.nodes: list[Child] = []
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
            self.master = _kvpool_child(args, name="kvpool master")
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
    ) -> Child:
        """Start one more `kvpool node` of `segment_size` bytes and wait until it has mounted."""
        node = _kvpool_child(
            [
                "node",
                "--master",
                self.address,
                "--segment-size",
                str(segment_size),
                "--host",
                self.spec.host,
                *self.spec.node_args,
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
            self.master.stop(grace=10.0)

    def __enter__(self) -> EmbeddedPool:
        if self._address is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
