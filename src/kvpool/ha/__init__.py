"""kvpool.ha: high availability of the master, coordinated through etcd (issue #14, part 1).

What it owns: the keys a cluster keeps in etcd, leader election with fencing by term, master
membership, and leader discovery for clients and nodes. It is not wired into `kvpool master` or
the Store yet; docs/parts/ha.md tells the design, the measurements behind it and what is left.

    discovery.py     LeaderDiscovery: find the leader (address, term), follow it, refuse old terms
    election.py      Election: campaign, lead while the lease is surely alive, step down, resign
    membership.py    Membership / MemberRecord: /kvpool/<cluster>/members/<id> on a lease
    lease.py         LeaseKeeper / LeaseConfig: one lease kept alive, with a safe local deadline
    leader.py        LeaderView: the leader record (member id, address, term)
    url.py           EtcdUrl: etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID
    keys.py          ClusterKeys: the key layout of one cluster
    gateway.py       EtcdGateway: the Coordinator over etcd's JSON gateway (standard library)
    coordinator.py   Coordinator / Watch: the narrow etcd interface everything above uses

May import `kvpool.errors`, `kvpool.config`, `kvpool.override` and msgspec; never the master,
the client, the data plane, the cache, compat, the CLI or the benchmarks (an import-linter
contract holds that), so both the master and the clients can build on it.
"""

from __future__ import annotations

from kvpool.ha.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorUnavailable,
    WatchLost,
)
from kvpool.ha.discovery import LeaderDiscovery
from kvpool.ha.election import Election, ElectionConfig, ElectionState, Role
from kvpool.ha.gateway import EtcdGateway
from kvpool.ha.keys import ClusterKeys
from kvpool.ha.leader import LeaderView
from kvpool.ha.lease import LeaseConfig, LeaseKeeper
from kvpool.ha.membership import MemberRecord, Membership
from kvpool.ha.url import EtcdUrl

__all__ = [
    "ClusterKeys",
    "Coordinator",
    "CoordinatorError",
    "CoordinatorUnavailable",
    "Election",
    "ElectionConfig",
    "ElectionState",
    "EtcdGateway",
    "EtcdUrl",
    "LeaderDiscovery",
    "LeaderView",
    "LeaseConfig",
    "LeaseKeeper",
    "MemberRecord",
    "Membership",
    "Role",
    "WatchLost",
]
