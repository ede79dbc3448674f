"""HA masters with an auth file: the standby follows the leader's log with the first admin
token, and a Store following the leader (etcd:// master) proves its token to each leader."""

from __future__ import annotations

from pathlib import Path

from kvpool import Store
from kvpool.errors import KVPoolError, ReplicaNotReady
from kvpool.protocol.messages import HaStatus, HaStatusReply, Response
from kvpool.rpc.client import RpcClient
from kvtest.etcd import EtcdServer
from kvtest.ha import HaMaster
from kvtest.procs import wait_until

NODE = "ha-node-token-000000000000000000001"
ADMIN = "ha-admin-token-00000000000000000002"


def status(m: HaMaster) -> HaStatusReply | None:
    try:
        with RpcClient(
            m.address, response_type=Response, cluster_id=m.cluster, token=ADMIN.encode()
        ) as rpc:
            return rpc.call_as(HaStatus(), HaStatusReply, timeout=2)
    except (KVPoolError, OSError):
        return None


def test_standbys_and_stores_follow_an_authenticated_leader(
    etcd_shared: EtcdServer, cluster: str, masters: list[HaMaster], tmp_path: Path
) -> None:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {NODE}, tenant: t, role: node}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    for name in ("m1", "m2"):
        masters.append(HaMaster(etcd_shared.endpoint, cluster, name, "--auth-file", str(auth)))

    def leader_with_standby() -> HaMaster | None:
        for m in masters:
            s = status(m)
            if s is not None and s.role == "leader" and s.standbys:
                return m
        return None

    # The standby is in sync only if its FollowLog connection proved the admin token.
    leader = wait_until(leader_with_standby, 30, what="a leader with its standby in sync")
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    with Store(url, segment_size="16MiB", token=NODE, failover_timeout=20) as store:
        store.put("k", b"v" * 1000)
        leader.proc.stop()
        survivor = next(m for m in masters if m is not leader)
        wait_until(
            lambda: (s := status(survivor)) is not None and s.role == "leader",
            30,
            what="the standby to lead",
        )

        def read() -> bytearray | None:
            try:
                return store.get("k")
            except ReplicaNotReady:  # until the Store has remounted on the new leader
                return None

        assert wait_until(read, 30, what="the value from the new leader") == b"v" * 1000
