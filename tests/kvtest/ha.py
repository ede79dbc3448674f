"""HA masters for tests: `kvpool master --ha etcd://.../CLUSTER` processes and their role.

`HaMaster` is one master process (port 0, advertising the port it bound) with a short lease
unless told otherwise; `role(address)` asks any master its `HaStatus`; `wait_leader` waits
until exactly one of some masters says it leads and answers it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence

import pytest
import xxhash

from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import (
    BatchGetReplicaList,
    BatchReplicaListReply,
    ClientId,
    ClientStatus,
    HaStatus,
    HaStatusReply,
    HostId,
    Ping,
    PingReply,
    PutEnd,
    PutStart,
    PutStartReply,
    ReMountSegment,
    Reply,
    Response,
    SegmentInfo,
    SegmentName,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient
from kvtest.procs import Proc, kvpool_proc, wait_until

__all__ = [
    "FakeNode",
    "HaMaster",
    "checksum",
    "checksums",
    "master_rpc",
    "masters",
    "nodes",
    "put",
    "role",
    "stats",
    "wait_leader",
]


class HaMaster:
    """One `kvpool master --ha` process; `address` is its HOST:PORT."""

    def __init__(
        self,
        etcd_endpoint: str,
        cluster: str,
        name: str,
        *extra: str,
        ttl: int = 2,
        port: int | None = None,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.args = [
            "master",
            "--port",
            str(port or 0),
            "--ha",
            f"etcd://{etcd_endpoint}/{cluster}",
            "--member-id",
            name,
            "--ha-lease-ttl",
            str(ttl),
            "--client-ttl",
            "2s",
            "--client-dead-ttl",
            "60s",
            *extra,
        ]
        self.proc: Proc = kvpool_proc(*self.args, name=f"master {name}")
        self.address = self.proc.wait_ready(timeout=30)
        self.port = int(self.address.rsplit(":", 1)[1])

    def restart(self) -> None:
        """Start it again on the same port (and data directory, if any)."""
        self.args[2] = str(self.port)
        self.proc = kvpool_proc(*self.args, name=f"master {self.name}")
        self.proc.wait_ready(timeout=30)

    def status(self) -> HaStatusReply | None:
        return role(self.address, self.cluster)

    def stop(self) -> None:
        self.proc.stop()


def role(address: str, cluster: str, timeout: float = 2.0) -> HaStatusReply | None:
    """The master's HaStatus, or None when it does not answer."""
    try:
        with RpcClient(address, response_type=Response, cluster_id=cluster) as rpc:
            return rpc.call_as(HaStatus(), HaStatusReply, timeout=timeout)
    except (KVPoolError, OSError):
        return None


def wait_leader(masters: Sequence[HaMaster], timeout: float = 15.0) -> HaMaster:
    """The one master that says it leads (and has finished its promotion)."""

    def leader() -> HaMaster | None:
        found = [m for m in masters if (s := m.status()) is not None and s.role == "leader"]
        return found[0] if len(found) == 1 else None

    return wait_until(leader, timeout, interval=0.05, what="one master to lead")


class FakeNode:
    """A node's control plane without memory: registers a segment at `address`, pings it
    every `interval` and remounts (same generation) when told NEED_REMOUNT; `point()` moves
    it to another master (a new leader). Puts name replicas on its segment; no bytes move."""

    def __init__(
        self, address: str, cluster: str, name: str = "seg-0", size: int = 256 << 20
    ) -> None:
        self.client_id = ClientId(f"fake-{name}")
        self.cluster = cluster
        self.segment = SegmentInfo(
            SegmentName(name), size, HostId("fake-host"), "127.0.0.1:1", "", self.client_id, 77
        )
        self.address = address
        self.remounts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.mount()
        self._thread = threading.Thread(target=self._run, name=f"fake-node-{name}", daemon=True)
        self._thread.start()

    def mount(self) -> Reply:
        with self._rpc() as rpc:
            reply = rpc.call(ReMountSegment(self.client_id, HostId("fake-host"), [self.segment]))
        assert reply.code == 0, reply
        self.remounts += 1
        return reply  # type: ignore[no-any-return]

    def point(self, address: str) -> None:
        with self._lock:
            self.address = address

    def _rpc(self) -> RpcClient:
        with self._lock:
            address = self.address
        return RpcClient(address, response_type=Response, cluster_id=self.cluster, timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                with self._rpc() as rpc:
                    reply = rpc.call_as(Ping(self.client_id), PingReply)
                if reply.client_status == ClientStatus.NEED_REMOUNT:
                    self.mount()
            except (KVPoolError, OSError):
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def checksum(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode())


def put(rpc: RpcClient, client_id: ClientId, key: str, size: int = 4096) -> None:
    """PutStart + PutEnd (checksum of the key); raises what the master answers."""
    start = rpc.call_as(PutStart(client_id, key, size), PutStartReply)
    if start.code != 0:
        raise KVPoolError(f"PutStart {key}: {start.code}", ErrorCode.of(start.code))
    end = rpc.call_as(PutEnd(client_id, key, checksum(key)), Reply)
    if end.code != 0:
        raise KVPoolError(f"PutEnd {key}: {end.code}", ErrorCode.of(end.code))


def checksums(address: str, cluster: str, keys: list[str]) -> dict[str, int | None]:
    """Each key's checksum at `address` (missing keys absent)."""
    out: dict[str, int | None] = {}
    with RpcClient(address, response_type=Response, cluster_id=cluster) as rpc:
        for i in range(0, len(keys), 1000):
            part = keys[i : i + 1000]
            reply = rpc.call_as(BatchGetReplicaList(part), BatchReplicaListReply)
            for k, r in zip(part, reply.results, strict=True):
                if r.code == 0 and r.replicas:
                    out[k] = r.checksum
    return out


def stats(address: str, cluster: str) -> StatsReply:
    """The master's Stats (of a pool with its own cluster id)."""
    with RpcClient(address, response_type=Response, cluster_id=cluster) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def master_rpc(m: HaMaster) -> RpcClient:
    """A client of master `m` (whatever its role), with a short timeout."""
    return RpcClient(m.address, response_type=Response, cluster_id=m.cluster, timeout=5.0)


@pytest.fixture
def masters() -> Iterator[list[HaMaster]]:
    """The HA masters a test starts (appends); each stopped at the end, thawed first if the
    test froze it."""
    started: list[HaMaster] = []
    try:
        yield started
    finally:
        for m in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.proc.pid, signal.SIGCONT)
            m.stop()


@pytest.fixture
def nodes() -> Iterator[list[FakeNode]]:
    """The fake nodes a test starts (appends); each closed at the end."""
    started: list[FakeNode] = []
    try:
        yield started
    finally:
        for n in started:
            n.close()
