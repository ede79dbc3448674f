"""kvpool.ha.membership: each master's key under members/, on a lease of its own."""

from __future__ import annotations

from kvpool.ha import ClusterKeys, EtcdGateway, LeaseConfig, MemberRecord, Membership
from kvtest.procs import wait_until


def test_members_register_and_leave(gateway: EtcdGateway, cluster: str) -> None:
    keys = ClusterKeys(cluster)
    a = Membership(gateway, keys, "a", "127.0.0.1:1", lease=LeaseConfig(ttl=2))
    b = Membership(gateway, keys, "b", "127.0.0.1:2", lease=LeaseConfig(ttl=2))
    a.start()
    b.start()
    try:
        assert a.wait_registered(5) and b.wait_registered(5)
        assert a.registered()
        assert a.members() == {
            "a": MemberRecord("a", "127.0.0.1:1"),
            "b": MemberRecord("b", "127.0.0.1:2"),
        }
        a.close()
        assert set(b.members()) == {"b"}  # revoked on close: gone at once
    finally:
        a.close()
        b.close()
    assert gateway.get_prefix(keys.members)[0] == []


def test_a_member_registers_again_after_etcd_loses_its_lease(
    gateway: EtcdGateway, cluster: str
) -> None:
    gw = gateway
    keys = ClusterKeys(cluster)
    m = Membership(gw, keys, "a", "127.0.0.1:1", lease=LeaseConfig(ttl=2), retry_interval=0.1)
    m.start()
    try:
        assert m.wait_registered(5)
        kv, _ = gw.get(keys.member("a"))
        assert kv is not None
        gw.revoke(kv.lease)  # as if etcd had expired it
        wait_until(
            lambda: (k := gw.get(keys.member("a"))[0]) is not None and k.lease != kv.lease,
            5,
            what="a new registration",
        )
        assert m.registered()
    finally:
        m.close()
