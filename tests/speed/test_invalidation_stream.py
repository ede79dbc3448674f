"""The master's invalidation stream, seen from a raw connection: a subscriber hears the keys
of its tenant that are removed, nothing of other tenants, and `everything` when a segment
goes away."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.errors import KVPoolError, PermissionDenied
from kvpool.protocol.invalidation import Invalidate, Subscribe, decode_push
from kvpool.protocol.messages import Reply, Response, TenantId
from kvpool.rpc.client import RpcClient
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import kvpool_proc, wait_until


@pytest.fixture
def two_nodes(pool: PoolFactory) -> Pool:  # noqa: F811
    return pool(nodes=2, segment_size="16MiB")


@pytest.fixture
def listener(two_nodes: Pool) -> Iterator[tuple[RpcClient, list[Invalidate | None]]]:
    heard: list[Invalidate | None] = []
    with RpcClient(two_nodes.address, response_type=Response) as rpc:
        rpc.on_push = lambda payload: heard.append(decode_push(payload))
        assert rpc.call_as(Subscribe(TenantId("t1")), Reply).code == 0
        assert rpc.call_as(Subscribe(TenantId("t1")), Reply).code == 0  # idempotent
        yield rpc, heard


def _keys(heard: list[Invalidate | None]) -> set[str]:
    return {k for m in heard if m is not None for k in m.keys}


def test_a_subscriber_hears_its_tenants_removals_only(
    two_nodes: Pool, listener: tuple[RpcClient, list[Invalidate | None]]
) -> None:
    rpc, heard = listener
    with Store(two_nodes.address, tenant="t1") as t1, Store(two_nodes.address, tenant="t2") as t2:
        t1.batch_put(["a", "b", "c"], [b"1", b"2", b"3"])
        t2.put("a2", b"x")
        t2.remove("a2")
        t1.batch_remove(["a", "b"])

        def heard_both() -> bool:
            rpc.poll()
            return {"a", "b"} <= _keys(heard)

        wait_until(heard_both, timeout=5, what="the removals to be pushed")
        assert "c" not in _keys(heard) and "a2" not in _keys(heard)
        assert all(m is not None and m.tenant == "t1" for m in heard)
        t1.remove_all(force=True)


def test_a_segment_that_goes_away_invalidates_everything(
    two_nodes: Pool, listener: tuple[RpcClient, list[Invalidate | None]]
) -> None:
    rpc, heard = listener
    assert two_nodes.stop_node(1) == 0  # a clean stop unmounts its segment

    def heard_everything() -> bool:
        rpc.poll()
        return any(m is not None and m.everything for m in heard)

    wait_until(heard_everything, timeout=10, what="an everything push")


def test_a_client_token_subscribes_to_its_own_tenant_only(tmp_path: Path) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        "tokens:\n"
        "  - {token: speed-client-token-a-000000000001, tenant: a, role: client}\n"
        "  - {token: speed-node-token-a-00000000000002, tenant: a, role: node}\n"
    )
    master = kvpool_proc("master", "--port", "0", "--auth-file", str(auth))
    try:
        address = master.wait_ready()
        with RpcClient(
            address, response_type=Response, token=b"speed-client-token-a-000000000001"
        ) as rpc:
            assert rpc.call_as(Subscribe(TenantId("a")), Reply).code == 0
            with pytest.raises(PermissionDenied):
                rpc.call(Subscribe(TenantId("b")))
        with Store(address, read_mode="cached", token="speed-client-token-a-000000000001") as store:
            assert store._invalidations is not None
            assert store._invalidations.unsupported is False
            assert store._invalidations._conn is not None
    finally:
        master.stop()


def test_a_lost_master_connection_clears_what_was_remembered(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="16MiB")
    with Store(p.address, read_mode="cached", rpc_timeout=2.0, location_ttl=60.0) as s:
        assert s.put("k", b"v" * 64) is True
        assert s._locations is not None and len(s._locations) == 1
        p.master.stop()  # the stream is gone with its connection

        def forgotten() -> bool:
            try:
                s.get("k")
            except KVPoolError:
                return True  # not served from the remembered place: the master is asked
            return False

        wait_until(forgotten, timeout=10, what="the remembered place to be dropped")
        assert len(s._locations) == 0
