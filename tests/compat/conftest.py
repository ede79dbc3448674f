"""Backends for the Mooncake compatibility suite: the same tests, two implementations.

Every test in tests/compat takes the `backend` fixture, which is parametrized over

* ``kvpool``: `kvpool.compat.mooncake` against a real `kvpool master` child process (skipped,
  with the reason, while `kvpool.client.Store` is not importable);
* ``mooncake``: the real wheel (`mooncake.store`) against a real `mooncake_master` and the Python
  `mooncake_http_metadata_server`. Opt-in: it runs only when the wheel is importable AND
  KVPOOL_TEST_REAL_MOONCAKE=1, because Mooncake's client binds listeners on every interface
  (docs/compat.md, "How this is checked"), which a default test run must not do.

So a divergence between the two shows up as one parametrized test that passes on one backend and
fails on the other. Both masters run with a short lease (500 ms, as Mooncake's own CI does) so
that tests waiting for a lease to expire stay short; they wait on a condition, never a sleep.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvtest.procs import Proc, free_port, kvpool_proc, wait_until

LEASE_TTL_MS = 500
SEGMENT = 16 << 20
BUFFER = 16 << 20
REAL_MOONCAKE_ENV = "KVPOOL_TEST_REAL_MOONCAKE"


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _real_mooncake_skip_reason() -> str | None:
    if os.environ.get(REAL_MOONCAKE_ENV) != "1":
        return (
            f"real Mooncake is opt-in: set {REAL_MOONCAKE_ENV}=1 (its client binds all interfaces)"
        )
    if importlib.util.find_spec("mooncake") is None:
        return "the Mooncake wheel is not installed (pip install kvpool[bench])"
    try:
        importlib.import_module("mooncake.store")
    except ImportError as exc:
        return f"mooncake.store does not import: {exc}"
    return None


def _kvpool_skip_reason() -> str | None:
    try:
        client = importlib.import_module("kvpool.client")
    except ImportError as exc:  # pragma: no cover - the package skeleton always exists
        return f"kvpool.client does not import: {exc}"
    if not hasattr(client, "Store"):
        return "kvpool.client.Store is not built yet (issue 'Core pool 3/3')"
    return None


@dataclass
class Backend:
    """One implementation of the Mooncake Python API and the cluster it talks to."""

    name: str
    module: ModuleType  # what `mooncake.store` is for this backend
    config_cls: Any  # MooncakeConfig
    master: str  # "127.0.0.1:PORT"
    metadata_server: str  # what setup() is given; kvpool ignores it
    _stores: list[Any] = field(default_factory=list)

    def new(self) -> Any:
        """A fresh MooncakeDistributedStore, not set up; closed when the test ends."""
        store = self.module.MooncakeDistributedStore()
        self._stores.append(store)
        return store

    def setup_args(
        self, hostname: str = "127.0.0.1", segment: int = SEGMENT, buffer: int = BUFFER
    ) -> tuple[str, str, int, int, str, str, str]:
        """The seven positional arguments of setup(), as vLLM and SGLang pass them."""
        return (hostname, self.metadata_server, segment, buffer, "tcp", "", self.master)

    def store(self, **kw: Any) -> Any:
        """A store that is set up (asserts setup returned 0)."""
        store = self.new()
        rc = store.setup(*self.setup_args(**kw))
        assert rc == 0, f"{self.name}: setup returned {rc}"
        return store

    def close_all(self) -> None:
        while self._stores:
            self._stores.pop().close()


@dataclass
class _Cluster:
    name: str
    module: ModuleType
    config_cls: Any
    master: str
    metadata_server: str


def _start_mooncake(procs: list[Proc]) -> _Cluster:
    bindir = Path(sys.executable).parent
    rpc, metrics, meta = free_port(), free_port(), free_port()
    procs.append(
        Proc(
            [
                str(bindir / "mooncake_master"),
                "--rpc_address=127.0.0.1",
                f"--rpc_port={rpc}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={metrics}",
                f"--default_kv_lease_ttl={LEASE_TTL_MS}",
            ],
            name="mooncake_master",
        )
    )
    # Not the master's embedded metadata server: it ignores its host flag and binds 0.0.0.0.
    procs.append(
        Proc(
            [
                str(bindir / "mooncake_http_metadata_server"),
                "--host",
                "127.0.0.1",
                "--port",
                str(meta),
            ],
            name="mooncake_http_metadata_server",
        )
    )
    wait_until(lambda: _port_open(rpc) and _port_open(meta), 30, what="mooncake master + metadata")
    store_mod = importlib.import_module("mooncake.store")
    config_mod = importlib.import_module("mooncake.mooncake_config")
    return _Cluster(
        "mooncake",
        store_mod,
        config_mod.MooncakeConfig,
        f"127.0.0.1:{rpc}",
        f"http://127.0.0.1:{meta}/metadata",
    )


def _start_kvpool(procs: list[Proc]) -> _Cluster:
    proc = kvpool_proc(
        "master",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--default-kv-lease-ttl",
        f"{LEASE_TTL_MS}ms",
    )
    procs.append(proc)
    address = proc.wait_ready(timeout=30)
    mod = importlib.import_module("kvpool.compat.mooncake")
    # The same metadata_server form the Mooncake backend gets, pointing nowhere: kvpool keeps
    # segment metadata in its master and must not need (or contact) a metadata server.
    return _Cluster("kvpool", mod, mod.MooncakeConfig, address, "http://127.0.0.1:1/metadata")


_STARTERS: dict[str, Callable[[list[Proc]], _Cluster]] = {
    "kvpool": _start_kvpool,
    "mooncake": _start_mooncake,
}
_SKIPS: dict[str, Callable[[], str | None]] = {
    "kvpool": _kvpool_skip_reason,
    "mooncake": _real_mooncake_skip_reason,
}


@pytest.fixture(scope="module", params=["kvpool", "mooncake"])
def cluster(request: pytest.FixtureRequest) -> Iterator[_Cluster]:
    """A running master (and, for Mooncake, metadata server), one per module and backend."""
    name: str = request.param
    reason = _SKIPS[name]()
    if reason is not None:
        pytest.skip(reason)
    procs: list[Proc] = []
    try:
        yield _STARTERS[name](procs)
    finally:
        for proc in reversed(procs):
            proc.stop()


@pytest.fixture
def backend(cluster: _Cluster) -> Iterator[Backend]:
    """The backend for one test; every store it made is closed when the test ends."""
    b = Backend(
        cluster.name, cluster.module, cluster.config_cls, cluster.master, cluster.metadata_server
    )
    try:
        yield b
    finally:
        b.close_all()


@dataclass
class PrivateCluster:
    """A cluster of the test's own (so a test may stop its master); `procs[0]` is the master."""

    backend: Backend
    procs: list[Proc]

    def stop_master(self) -> None:
        self.procs[0].stop()


@pytest.fixture
def private_cluster(cluster: _Cluster) -> Iterator[PrivateCluster]:
    """A second cluster of the same backend, for tests that break it; all stopped at the end."""
    procs: list[Proc] = []
    b: Backend | None = None
    try:
        c = _STARTERS[cluster.name](procs)
        b = Backend(c.name, c.module, c.config_cls, c.master, c.metadata_server)
        yield PrivateCluster(b, procs)
    finally:
        if b is not None:
            b.close_all()
        for proc in reversed(procs):
            proc.stop()
