"""A stand-in for an HA election in tests: write who leads a cluster straight into etcd.

Until `kvpool master --ha` runs elections, client and node tests play the election themselves:
`publish(gateway, cluster, address, term)` puts the `LeaderView` at the cluster's leader key (and
the term key, as a campaign does), so the Stores and nodes following `etcd://.../cluster` see a
new leader exactly as they would after a real election. `master(cluster)` starts a plain
`kvpool master` of that cluster id (the id of the `etcd://` URL is the RPC cluster id too).
"""

from __future__ import annotations

from kvpool.ha import ClusterKeys, EtcdGateway, LeaderView
from kvpool.protocol.messages import Response, Stats, StatsReply
from kvpool.rpc.client import RpcClient
from kvtest.procs import Proc, kvpool_proc

__all__ = ["master", "publish", "stats"]


def publish(
    gateway: EtcdGateway, cluster: str, address: str, term: int, member: str = ""
) -> LeaderView:
    """Make `address` the leader of `cluster` in term `term` (what a won campaign writes)."""
    keys = ClusterKeys(cluster)
    view = LeaderView(member or f"m{term}", address, term)
    gateway.put(keys.term, str(term).encode())
    gateway.put(keys.leader, view.encode())
    return view


def master(cluster: str, *args: str, name: str = "master") -> tuple[Proc, str]:
    """A plain `kvpool master` of cluster id `cluster` on an ephemeral port, and its address."""
    proc = kvpool_proc(
        "master", "--port", "0", "--cluster-id", cluster, "--no-unix-socket", *args, name=name
    )
    try:
        return proc, proc.wait_ready()
    except BaseException:
        proc.stop()
        raise


def stats(address: str, cluster: str) -> StatsReply:
    """The Stats of the master at `address` (cluster id `cluster`), on a connection of its own."""
    with RpcClient(address, response_type=Response, cluster_id=cluster, timeout=5.0) as rpc:
        return rpc.call_as(Stats(), StatsReply)
