"""`kvpool master --ha ... --tenant-quota-file etcd`: the quota policy is the value of
`/kvpool/<cluster>/quota` in the group's etcd, read by every master once a second: written,
raised, broken (the quotas in force stay) and deleted (no quotas) while a master serves."""

from __future__ import annotations

from kvpool.errors import ErrorCode
from kvpool.ha import EtcdGateway
from kvpool.protocol import messages as m
from kvpool.rpc.client import RpcClient
from kvtest.etcd import EtcdServer
from kvtest.ha import FakeNode, HaMaster, wait_leader
from kvtest.procs import run_kvpool, wait_until

KiB = 1 << 10


def _policy(quota: str) -> bytes:
    return f"version: 1\ntenants:\n  - {{name: a, quota: {quota}}}\n".encode()


def test_the_quota_policy_in_etcd_is_applied_and_followed(
    etcd_shared: EtcdServer, cluster: str
) -> None:
    gateway = EtcdGateway([etcd_shared.endpoint])
    key = f"/kvpool/{cluster}/quota".encode()
    master = HaMaster(etcd_shared.endpoint, cluster, "m1", "--tenant-quota-file", "etcd")
    node: FakeNode | None = None
    try:
        gateway.put(key, _policy("16KiB"))
        wait_leader([master])
        node = FakeNode(master.address, cluster)  # pings: its segment stays usable
        with RpcClient(master.address, response_type=m.Response, cluster_id=cluster) as c:
            w, a = m.ClientId("w"), m.TenantId("a")
            assert c.call(m.ReMountSegment(w, m.HostId("h"))).code == 0

            def code(k: str, size: int) -> int:
                c.call(m.Ping(w))  # the writer stays registered (client ttl 2 s here)
                reply = c.call(m.PutStart(w, k, size, tenant=a))
                if reply.code == 0:
                    assert c.call(m.PutRevoke(w, k, tenant=a)).code == 0
                return int(reply.code)

            wait_until(
                lambda: code("k", 32 * KiB) == ErrorCode.TENANT_QUOTA_EXCEEDED,
                10,
                what="the quota from etcd",
            )
            assert code("k", 8 * KiB) == 0
            gateway.put(key, _policy("64KiB"))
            wait_until(lambda: code("k", 32 * KiB) == 0, 10, what="the raised quota")
            gateway.put(key, b"version: 1\ntenants: [{name: a}]\n")  # broken: 64 KiB stays
            master.proc.wait_for_line("tenant quotas in .* not applied", timeout=10)
            assert code("k", 100 * KiB) == ErrorCode.TENANT_QUOTA_EXCEEDED
            assert code("k", 32 * KiB) == 0
            gateway.delete(key)  # no policy: no quotas
            wait_until(lambda: code("k", 100 * KiB) == 0, 10, what="the quotas to go")
    finally:
        if node is not None:
            node.close()
        master.stop()
        gateway.close()


def test_a_master_without_ha_refuses_an_etcd_quota_source() -> None:
    out = run_kvpool("master", "--port", "0", "--tenant-quota-file", "etcd")
    assert out.returncode == 2 and "--ha" in out.stderr
