"""DFS replicas across a leader switch (`kvpool master --ha ... --dfs-root`, real processes on a
real etcd): the standby's copy knows each object's DFS replica, so after SIGKILL of the node
and then of the leader, the new leader serves every object from its file."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.protocol.messages import ReplicaKind
from kvtest.dfs import DFS
from kvtest.etcd import EtcdServer
from kvtest.ha import HaMaster, wait_leader
from kvtest.procs import Proc, kvpool_proc, wait_until
from kvtest.replicas import kinds
from kvtest.values import pattern


def value(i: int) -> bytes:
    return pattern(i, b"dfs-ha..")


@pytest.fixture
def procs() -> Iterator[list[HaMaster | Proc | Store]]:
    made: list[HaMaster | Proc | Store] = []
    try:
        yield made
    finally:
        for p in reversed(made):
            if isinstance(p, HaMaster):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.proc.pid, signal.SIGCONT)
            with contextlib.suppress(Exception):
                p.close() if isinstance(p, Store) else p.stop()


def test_dfs_copies_survive_a_leader_switch(
    etcd_shared: EtcdServer,
    cluster: str,
    tmp_path: Path,
    procs: list[HaMaster | Proc | Store],
) -> None:
    root = str(tmp_path / "dfs")
    masters = [HaMaster(etcd_shared.endpoint, cluster, n, "--dfs-root", root) for n in "ab"]
    procs.extend(masters)
    leader = wait_leader(masters)
    standby = next(m for m in masters if m is not leader)
    url = f"etcd://{etcd_shared.endpoint}/{cluster}"
    node = kvpool_proc("node", "--master", url, "--segment-size", "16MiB", "--no-progress")
    procs.append(node)
    node.wait_ready(timeout=60)
    s = Store(url, rpc_timeout=20.0)
    procs.append(s)
    for i in range(3):
        assert s.put(f"h{i}", value(i), DFS)
    wait_until(
        lambda: (st := standby.status()) is not None and st.objects == 3,
        timeout=10,
        what="the standby's copy to hold every object",
    )
    node.kill9()
    leader.proc.kill9()
    wait_until(
        lambda: (st := standby.status()) is not None and st.role == "leader",
        timeout=15,
        what="the standby to lead",
    )
    for i in range(3):  # no node at all: the new leader knows the files
        assert s.get(f"h{i}") == value(i)
    assert kinds(s, "h0") == [ReplicaKind.DFS]
