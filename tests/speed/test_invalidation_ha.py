"""The invalidation stream with HA masters: only the leader takes subscriptions (a standby
refuses with NOT_LEADER naming the leader, so a client subscribes where the changes happen),
and the leader pushes what is removed there."""

from __future__ import annotations

import pytest

from kvpool.errors import ErrorCode, NotLeader
from kvpool.protocol.invalidation import Invalidate, Subscribe, decode_push
from kvpool.protocol.messages import Remove, Reply, Response, TenantId
from kvpool.rpc.client import RpcClient
from kvtest.etcd import EtcdServer
from kvtest.ha import FakeNode, HaMaster, put, wait_leader
from kvtest.procs import wait_until


def test_only_the_leader_takes_subscriptions_and_pushes_its_removals(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster]
) -> None:
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "s1"))
    masters.append(HaMaster(etcd_shared.endpoint, cluster, "s2"))
    leader = wait_leader(masters)
    standby = next(m for m in masters if m is not leader)
    with RpcClient(standby.address, response_type=Response, cluster_id=cluster) as c:

        def refusal() -> NotLeader | None:
            with pytest.raises(NotLeader) as err:
                c.call(Subscribe(TenantId("default")))
            assert err.value.code is ErrorCode.NOT_LEADER
            # The standby learns the leader from etcd's watch, a moment after the leader
            # itself knows (`wait_leader`): until then it refuses without a name.
            return err.value if "leader unknown" not in err.value.message else None

        refused = wait_until(refusal, timeout=10, what="the standby to name the leader")
        assert f"leader={leader.address}" in refused.message
    node = FakeNode(leader.address, cluster)
    heard: list[Invalidate | None] = []
    try:
        with RpcClient(leader.address, response_type=Response, cluster_id=cluster) as c:
            c.on_push = lambda payload: heard.append(decode_push(payload))
            assert c.call_as(Subscribe(TenantId("default")), Reply).code == 0
            put(c, node.client_id, "gone")
            assert c.call_as(Remove("gone", force=True), Reply).code == 0

            def heard_it() -> bool:
                c.poll()
                return any(m is not None and "gone" in m.keys for m in heard)

            wait_until(heard_it, timeout=5, what="the leader's push")
    finally:
        node.close()
