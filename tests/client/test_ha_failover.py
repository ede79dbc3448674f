"""`FailoverRpcClient` and the Store under a leader switch, against small servers in front of etcd.

A `NOT_LEADER` answer moves the client to the leader etcd names (no watch needed), and fails
with a clear message once `failover_timeout` passes without one. A put whose PutEnd or PutCommit
is answered LEADER_CHANGED (the master lost the lead mid-replication: applied or not) goes through
a proxy in front of a real master: the Store asks the leader what it holds and finishes the put
exactly once, whichever way the first attempt went.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool import Store
from kvpool.client.leader import FailoverRpcClient, LeaderFollower, Policy, policy_of
from kvpool.errors import ErrorCode, InvalidParams, NotLeader
from kvpool.ha import EtcdGateway, EtcdUrl
from kvpool.protocol import messages as m
from kvpool.rpc.client import RpcClient
from kvpool.rpc.server import Connection, RpcServer
from kvpool.rpc.thread import ServerThread
from kvtest.etcd import EtcdServer
from kvtest.leader import master, publish, stats
from kvtest.procs import Proc

Handler = Callable[[Any, Connection], Any]


@pytest.fixture
def serve(cluster: str) -> Iterator[Callable[[Handler], str]]:
    """Start an in-process RpcServer of the master's protocol with `handler`; its address."""
    threads: list[ServerThread[RpcServer]] = []

    def start(handler: Handler) -> str:
        server = RpcServer(handler, request_type=m.Request, cluster_id=cluster, unix=False)
        thread = ServerThread(server).start()
        threads.append(thread)
        return thread.server.endpoint

    try:
        yield start
    finally:
        for thread in threads:
            thread.stop()


def _standby(seen: Counter[str]) -> Handler:
    def handle(request: Any, conn: Connection) -> Any:
        seen[type(request).__name__] += 1
        raise NotLeader("this master is a standby", ErrorCode.NOT_LEADER)

    return handle


def _echo(request: Any, conn: Connection) -> Any:
    if isinstance(request, m.Echo):
        return m.EchoReply(request.payload)
    raise NotLeader("lost the lead while replicating", ErrorCode.LEADER_CHANGED)


def _client(etcd: EtcdServer, cluster: str, failover_timeout: float) -> FailoverRpcClient:
    follower = LeaderFollower(EtcdUrl.parse(f"etcd://{etcd.endpoint}/{cluster}"))
    return FailoverRpcClient(
        follower,
        follower.leader(5.0),
        failover_timeout=failover_timeout,
        response_type=m.Response,
        cluster_id=cluster,
        timeout=2.0,
    )


def test_a_not_leader_answer_moves_the_client_to_the_leader_etcd_names(
    etcd_shared: EtcdServer, gateway: EtcdGateway, cluster: str, serve: Callable[[Handler], str]
) -> None:
    seen: Counter[str] = Counter()
    standby = serve(_standby(seen))
    leader = serve(_echo)
    publish(gateway, cluster, standby, 1)
    client = _client(etcd_shared, cluster, failover_timeout=5.0)
    try:  # the follower is not started: no watch, only the NOT_LEADER answer moves it
        assert client.address == standby
        publish(gateway, cluster, leader, 2)
        assert client.call(m.Echo(b"hi")) == m.EchoReply(b"hi")
        assert client.address == leader
        assert client.min_term == 2
        assert seen["Echo"] == 1
    finally:
        client.close()
        client.follower.close()


def test_not_leader_without_a_successor_fails_once_failover_timeout_passes(
    etcd_shared: EtcdServer, gateway: EtcdGateway, cluster: str, serve: Callable[[Handler], str]
) -> None:
    seen: Counter[str] = Counter()
    publish(gateway, cluster, serve(_standby(seen)), 1)
    client = _client(etcd_shared, cluster, failover_timeout=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(NotLeader, match="failover_timeout 1 s") as info:
            client.call(m.Echo(b"hi"))
        assert info.value.code == ErrorCode.NOT_LEADER
        assert time.monotonic() - t0 < 3.0
        assert seen["Echo"] >= 2  # asked again, with a back-off, not once per microsecond
        assert seen["Echo"] < 60
    finally:
        client.close()
        client.follower.close()


def test_a_request_of_unknown_outcome_that_is_not_safe_to_repeat_fails_leader_changed(
    etcd_shared: EtcdServer, gateway: EtcdGateway, cluster: str, serve: Callable[[Handler], str]
) -> None:
    publish(gateway, cluster, serve(_echo), 1)
    client = _client(etcd_shared, cluster, failover_timeout=1.0)
    try:
        task = m.CreateCopyTask("k", [m.SegmentName("s")])
        assert policy_of(task) is Policy.UNSAFE
        with pytest.raises(NotLeader, match="whether it was applied is unknown") as info:
            client.call(task)
        assert info.value.code == ErrorCode.LEADER_CHANGED
    finally:
        client.close()
        client.follower.close()


def test_an_etcd_master_with_a_conflicting_cluster_id_is_refused() -> None:
    with pytest.raises(InvalidParams, match="conflicts with the cluster 'one'"):
        Store("etcd://127.0.0.1:2379/one", cluster_id="two")
    with pytest.raises(InvalidParams, match="no port"):
        Store("etcd://127.0.0.1/one")


# ----------------------------------------------------------------- puts of unknown outcome


class Proxy:
    """Forwards the master protocol to a real master; the first PutEnd / PutCommit / Remove
    (`fault_on`) is answered LEADER_CHANGED after being forwarded ("applied"), dropped
    ("dropped"), or dropped with the put revoked upstream, as a new leader that never heard of
    it ("forgotten")."""

    def __init__(self, upstream: str, cluster: str, mode: str, fault_on: tuple[type, ...]):
        self.rpc = RpcClient(upstream, response_type=m.Response, cluster_id=cluster, timeout=5.0)
        self.mode = mode
        self.fault_on = fault_on
        self.faults = 1
        self.forwarded: Counter[str] = Counter()

    async def _forward(self, request: Any) -> Any:
        self.forwarded[type(request).__name__] += 1
        return await asyncio.to_thread(self.rpc.call, request)

    def __call__(self, request: Any, conn: Connection) -> Any:
        if isinstance(request, self.fault_on) and self.faults > 0:
            self.faults -= 1
            return self._fault(request)
        return self._forward(request)

    async def _fault(self, request: Any) -> Any:
        if self.mode == "applied":
            await self._forward(request)
        elif self.mode == "forgotten" and isinstance(request, m.PutEnd):
            await self._forward(m.PutRevoke(request.client_id, request.key, request.tenant))
        raise NotLeader("lost the lead while replicating", ErrorCode.LEADER_CHANGED)


@pytest.fixture
def real_master(cluster: str) -> Iterator[str]:
    proc: Proc
    proc, address = master(cluster, name="master")
    try:
        yield address
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        ("putstart", "applied"),
        ("putstart", "dropped"),
        ("putstart", "forgotten"),
        ("arena", "applied"),
        ("arena", "dropped"),
    ],
)
def test_a_put_of_unknown_outcome_is_settled_by_the_leader_and_applied_once(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    serve: Callable[[Handler], str],
    real_master: str,
    path: str,
    mode: str,
) -> None:
    proxy = Proxy(real_master, cluster, mode, (m.PutEnd, m.PutCommit))
    publish(gateway, cluster, serve(proxy), 1)
    value = bytes(range(256)) * 400
    arena = "0" if path == "putstart" else "4MiB"
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    try:
        with Store(url, segment_size="32MiB", arena_size=arena, heartbeat_interval=0.2) as store:
            assert store.put("k", value) is True
            assert proxy.faults == 0
            assert store.get("k") == value
            assert stats(real_master, cluster).objects == 1
            end = "PutEnd" if path == "putstart" else "PutCommit"
            if mode == "forgotten":
                # The end sent again is refused (the leader never heard of the put), so the
                # put starts over: two PutStarts, two PutEnds, one object.
                assert proxy.forwarded["PutStart"] == 2
                assert proxy.forwarded[end] == 2
                assert store.put_stats.retries >= 1
            else:
                # applied: the lookup found it, nothing sent again; dropped: sent once more.
                assert proxy.forwarded[end] == 1
            assert store.put("k", value) is False  # insert-if-absent still holds
    finally:
        proxy.rpc.close()


def test_a_remove_of_unknown_outcome_that_finds_nothing_on_retry_is_done(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    serve: Callable[[Handler], str],
    real_master: str,
) -> None:
    proxy = Proxy(real_master, cluster, "applied", (m.Remove,))
    publish(gateway, cluster, serve(proxy), 1)
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    try:
        with Store(url, segment_size="32MiB", heartbeat_interval=0.2) as store:
            assert store.put("k", b"v" * 100)
            store.remove("k")  # applied, answered LEADER_CHANGED, asked again: not found = done
            assert proxy.forwarded["Remove"] == 2
            assert not store.exists("k")
            with pytest.raises(Exception, match="OBJECT_NOT_FOUND"):
                store.remove("k")  # a plain remove of an absent key still says so
    finally:
        proxy.rpc.close()


@pytest.mark.parametrize(
    ("path", "mode"),
    [("putstart", "applied"), ("putstart", "dropped"), ("arena", "applied"), ("arena", "dropped")],
)
def test_a_batch_put_of_unknown_outcome_is_settled_key_by_key(
    etcd_shared: EtcdServer,
    gateway: EtcdGateway,
    cluster: str,
    serve: Callable[[Handler], str],
    real_master: str,
    path: str,
    mode: str,
) -> None:
    proxy = Proxy(real_master, cluster, mode, (m.BatchPutEnd, m.BatchPutCommit))
    publish(gateway, cluster, serve(proxy), 1)
    keys = [f"k{i}" for i in range(8)]
    values = [bytes([i]) * (1000 + i) for i in range(8)]
    arena = "0" if path == "putstart" else "4MiB"
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    try:
        with Store(url, segment_size="32MiB", arena_size=arena, heartbeat_interval=0.2) as store:
            assert store.batch_put(keys, values) == [ErrorCode.OK] * len(keys)
            assert proxy.faults == 0
            assert store.batch_get(keys) == values
            assert stats(real_master, cluster).objects == len(keys)
            end = "BatchPutEnd" if path == "putstart" else "BatchPutCommit"
            assert proxy.forwarded[end] == 1
    finally:
        proxy.rpc.close()
