"""A whole pool for tests: a real `kvpool master` and N `kvpool node`s as processes on loopback.

Use the `pool` fixture (a factory: call it to start a pool; everything it started is stopped
after the test, also when the test fails) or `start_pool()` directly inside a `with`:

    from kvtest.pool import pool  # noqa: F401  (re-export the fixture into your test module)

    def test_something(pool):
        p = pool(nodes=2, segment_size="64MiB", client_ttl="2s")
        with Store(p.address) as store:
            ...
        p.kill_node(0)                  # kill -9 one node

`pool_module` is the same factory with module scope, for suites that share one pool.
Every process binds port 0 and is found through its `listening on HOST:PORT` line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from kvtest.procs import Proc, kvpool_proc


@dataclass
class Pool:
    """A running master and its nodes; `address` is the master's HOST:PORT."""

    master: Proc
    address: str
    nodes: list[Proc] = field(default_factory=list)
    node_endpoints: list[str] = field(default_factory=list)
    segment_size: str = "64MiB"

    def add_node(self, segment_size: str | None = None, *extra: str) -> Proc:
        """Start one more node and wait until it has mounted its segment."""
        proc = kvpool_proc(
            "node",
            "--master",
            self.address,
            "--segment-size",
            segment_size or self.segment_size,
            "--no-progress",
            *extra,
            name=f"kvpool node {len(self.nodes)}",
        )
        self.nodes.append(proc)
        self.node_endpoints.append(proc.wait_ready(timeout=60))
        return proc

    def kill_node(self, index: int) -> None:
        """SIGKILL node `index` (no unmount: the master must notice by itself)."""
        self.nodes[index].kill9()

    def stop_node(self, index: int) -> int:
        """SIGTERM node `index` (it unmounts cleanly); returns its exit code."""
        return self.nodes[index].stop()

    def stop(self) -> None:
        """Stop every node, then the master. Idempotent."""
        for proc in self.nodes:
            proc.stop()
        self.master.stop()


def start_pool(
    nodes: int = 1,
    segment_size: str = "64MiB",
    client_ttl: str | None = "2s",
    master_args: tuple[str, ...] = (),
) -> Pool:
    """Start a master (port 0) and `nodes` nodes; stops what it started if anything fails."""
    args = ["master", "--host", "127.0.0.1", "--port", "0"]
    if client_ttl is not None:
        args += ["--client-ttl", client_ttl]
    master = kvpool_proc(*args, *master_args, name="kvpool master")
    pool = Pool(master=master, address="", segment_size=segment_size)
    try:
        pool.address = master.wait_ready(timeout=30)
        for _ in range(nodes):
            pool.add_node()
    except BaseException:
        pool.stop()
        raise
    return pool


class PoolFactory:
    """Callable that starts pools and remembers them so the fixture can stop them."""

    def __init__(self) -> None:
        self.started: list[Pool] = []

    def __call__(
        self,
        nodes: int = 1,
        segment_size: str = "64MiB",
        client_ttl: str | None = "2s",
        master_args: tuple[str, ...] = (),
    ) -> Pool:
        p = start_pool(nodes, segment_size, client_ttl, master_args)
        self.started.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.started):
            p.stop()
        self.started.clear()


@pytest.fixture
def pool() -> Iterator[PoolFactory]:
    """A factory of pools (master + nodes as processes), all stopped after the test."""
    factory = PoolFactory()
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="module")
def pool_module() -> Iterator[PoolFactory]:
    """Like `pool`, shared by a module's tests (stopped after the last one)."""
    factory = PoolFactory()
    try:
        yield factory
    finally:
        factory.stop_all()


__all__ = ["Pool", "PoolFactory", "pool", "pool_module", "start_pool"]
