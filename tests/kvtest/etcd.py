"""A private etcd server for tests: Debian's `etcd` binary on loopback ports, stopped by its PID.

`EtcdServer` starts one single-member etcd with its client and peer URLs on 127.0.0.1 ephemeral
ports and its data in a directory the caller owns (`tmp_path`), so a test can stop it, freeze it
(`freeze` / `thaw`: SIGSTOP / SIGCONT of its PID) or restart it on the same data. Without the
binary the test skips, or fails when `KVPOOL_REQUIRE_SERVICES=1` (`kvtest.procs.require_binary`).
The fixture `etcd` in `tests/ha/conftest.py` wraps it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.ha import EtcdGateway
from kvtest.procs import Proc, free_port, freeze, require_binary, wait_until

__all__ = ["EtcdServer"]

READY = r"ready to serve client requests"


def _etcd_binary() -> str:
    """`require_binary("etcd")`, naming Debian's package (etcd-server) in the skip message."""
    import shutil

    missing = shutil.which("etcd") is None and not os.path.exists("/usr/sbin/etcd")
    if missing and os.environ.get("KVPOOL_REQUIRE_SERVICES") != "1":
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    return require_binary("etcd")


class EtcdServer:
    """One etcd member on 127.0.0.1; `endpoint` is "127.0.0.1:PORT" (its client URL)."""

    def __init__(self, data_dir: Path, name: str = "kvpool-test") -> None:
        self.binary = _etcd_binary()
        self.data_dir = data_dir
        self.name = name
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: Proc | None = None
        self.frozen = False

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start etcd (again, on the same data and ports) and wait until it serves."""
        assert self.proc is None or not self.proc.alive(), "etcd already runs"
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = Proc(
            [
                self.binary,
                "--name",
                self.name,
                "--data-dir",
                str(self.data_dir),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"{self.name}={peer}",
                "--initial-cluster-state",
                "new",
            ],
            name="etcd",
        )
        self.frozen = False
        self.proc.wait_for_line(READY, timeout=timeout)

    def stop(self) -> None:
        """SIGTERM (SIGCONT first if frozen), then SIGKILL after a grace period. Idempotent."""
        if self.proc is None:
            return
        self.thaw()
        self.proc.stop(grace=5.0)

    def kill(self) -> None:
        """SIGKILL (a crash); the data directory stays for `start()`."""
        if self.proc is not None:
            self.thaw()
            self.proc.kill9()

    def freeze(self) -> None:
        """SIGSTOP: etcd keeps its sockets but answers nothing (unreachable, not refused)."""
        assert self.proc is not None
        freeze(self.proc.pid)
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT after `freeze`; no-op otherwise."""
        if self.proc is not None and self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.frozen = False

    def wait_serving(self, timeout: float = 15.0) -> None:
        """Wait until a fresh TCP connection to the client port is accepted."""
        import socket

        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5).close()
            except OSError:
                return False
            return True

        wait_until(accepts, timeout, what=f"etcd on {self.endpoint}")


# Fixtures for every test that needs etcd (a plugin of tests/conftest.py): one server for the
# session, tests kept apart by cluster id (`cluster`); `gateway` is a client of it.


@pytest.fixture(scope="session")
def etcd_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd-shared") / "data")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def gateway(etcd_shared: EtcdServer) -> Iterator[EtcdGateway]:
    gw = EtcdGateway([etcd_shared.endpoint], timeout=2.0)
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> str:
    """A cluster id of this test's own (tests on the shared etcd never meet)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:100]
