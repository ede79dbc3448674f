"""Pool-mode eviction end to end: a `kvpool master --eviction-mode pool` and two `kvpool node`
processes whose task executors (kvpool.client.tasks) carry out the master's swap-outs. Filling
one node's segment past the high watermark moves replicas to the other node, bytes included,
and nothing is lost."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.client import ReplicateConfig, Store
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import wait_until

MiB = 1 << 20


@pytest.fixture(scope="module")
def pool(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(
        nodes=2,
        segment_size="16MiB",
        master_args=(
            "--eviction-mode",
            "pool",
            "--eviction-high-watermark-ratio",
            "0.8",
            "--eviction-ratio",
            "0.3",
            "--default-kv-lease-ttl",
            "100ms",
        ),
    )


def used(address: str) -> dict[str, int]:
    with RpcClient(address, response_type=m.Response) as rpc:
        reply = rpc.call(m.Stats())
    assert isinstance(reply, m.StatsReply)
    return {s.name: s.used for s in reply.segments}


def test_a_full_node_swaps_out_to_the_other_node_and_every_value_survives(pool: Pool) -> None:
    a, b = (e + "/0" for e in pool.node_endpoints)
    values = {
        f"obj-{i}": np.random.default_rng(i).integers(0, 256, MiB, dtype=np.uint8).tobytes()
        for i in range(14)
    }
    with Store(pool.address) as store:
        for key, data in values.items():
            assert store.put(key, data, ReplicateConfig(preferred_segments=[a]))
        # 14 of 16 MiB on a (> 80 %): kswapd moves replicas to b until a is back at 50 %.
        wait_until(
            lambda: used(pool.address)[a] <= 8 * MiB,
            timeout=20,
            what="the node past the high watermark to swap out down to the low one",
        )
        on_b = [k for k in values if [r.segment for r in store.get_replica_desc(k)] == [b]]
        assert len(on_b) >= 6
        for key, data in values.items():
            assert store.get(key) == data  # moved or not, every value is whole
        assert used(pool.address)[b] <= 8 * MiB  # b never taken past the low watermark
