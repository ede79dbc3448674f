"""Self-healing replicas (issue #13), with real processes on loopback: with replica_num=2 on 3
nodes, a node killed with SIGKILL is dropped after `client_dead_ttl` and the master copies every
object that lost a replica onto the third node, until each has 2 again; then a second node
can die and every acknowledged key still reads back with exact bytes."""

from __future__ import annotations

import numpy as np

from kvpool.client import ReplicateConfig, Store
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import wait_until
from kvtest.query import replica_segments, stats


def test_a_dead_nodes_replicas_are_copied_back_before_the_next_death(
    pool: PoolFactory,  # noqa: F811
) -> None:
    p = pool(
        nodes=3,
        segment_size="16MiB",
        client_ttl="1s",
        master_args=("--client-dead-ttl", "1s"),
    )
    seg = [e + "/0" for e in p.node_endpoints]
    rng = np.random.default_rng(5)
    data = {
        f"k{i}": rng.integers(0, 256, 1000 + 61 * i, dtype=np.uint8).tobytes() for i in range(120)
    }
    keys = list(data)
    with Store(p.address) as s:
        codes = s.batch_put(keys, list(data.values()), ReplicateConfig(replica_num=2))
        assert all(c == 0 for c in codes), codes
        placed = replica_segments(p.address, keys)
        assert all(len(x) == 2 for x in placed)
        assert any(seg[0] in x for x in placed)  # something to repair

        p.kill_node(0)

        def repaired() -> bool:
            now = replica_segments(p.address, keys)
            return all(len(x) == 2 and seg[0] not in x for x in now)

        wait_until(repaired, timeout=30, interval=0.1, what="every object to have 2 replicas")
        st = stats(p.address)
        assert st.under_replicated == 0 and st.repair_done > 0, st

        p.kill_node(1)
        for k, v in data.items():
            assert s.get(k) == v, k
