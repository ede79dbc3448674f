"""An HA master with real nodes and a real Store (bytes through the data plane): the lone leader
of its group with `--data-dir`, killed with SIGKILL and started again on the same port and
directory, leads again with every acknowledged object readable with its exact bytes once the
nodes remounted (their heartbeats reconnect to the same address), and takes new puts."""

from __future__ import annotations

from pathlib import Path

from kvpool.client import ReplicateConfig, Store
from kvtest.etcd import EtcdServer
from kvtest.ha import HaMaster, stats, wait_leader
from kvtest.pool import Pool
from kvtest.procs import wait_until
from kvtest.values import random_values

CLUSTER = "ha-reliability"


def values(prefix: str, n: int, seed: int) -> dict[str, bytes]:
    return random_values(prefix, n, seed, 2000, 61)


def test_a_lone_ha_leader_killed_and_restarted_on_its_data_dir_serves_every_acknowledged_key(
    tmp_path: Path,
) -> None:
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    master: HaMaster | None = None
    p: Pool | None = None
    try:
        master = HaMaster(etcd.endpoint, CLUSTER, "m1", "--data-dir", str(tmp_path / "meta"))
        wait_leader([master])
        p = Pool(master=master.proc, address=master.address)
        p.segment_size = "16MiB"
        p.add_node(None, "--cluster-id", CLUSTER)
        p.add_node(None, "--cluster-id", CLUSTER)
        one = values("one", 30, 1)
        two = values("two", 30, 2)
        with Store(master.address, cluster_id=CLUSTER) as s:
            for k, v in one.items():
                assert s.put(k, v)
            for k, v in two.items():
                assert s.put(k, v, ReplicateConfig(replica_num=2))
            segs = {x.name for x in stats(master.address, CLUSTER).segments}
            master.proc.kill9()
            master.restart()
            p.master = master.proc
            wait_leader([master], timeout=20)
            wait_until(
                lambda: {x.name for x in stats(master.address, CLUSTER).segments} == segs,
                30,
                what="both nodes to remount at the restarted leader",
            )
            for k, v in {**one, **two}.items():
                assert s.get(k) == v, k
            for k, v in values("after", 10, 3).items():
                assert s.put(k, v, ReplicateConfig(replica_num=2))
                assert s.get(k) == v
    finally:
        if p is not None:
            p.stop()
        elif master is not None:
            master.stop()
        etcd.stop()
