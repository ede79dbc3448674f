"""Issue 12: soft-pinned objects are evicted last across the whole pool, end to end.

A real `kvpool master` (default shard count, cache mode) and one `kvpool node` whose segment
holds 16 values; one soft-pinned value, then many unpinned ones are put through a `Store`. Every
put past capacity evicts something, and it must always be an unpinned object: the soft-pinned
one outlives them all. Nothing reads the objects before the end (a read would promote them and
protect them for another reason).
"""

from __future__ import annotations

from kvpool.client import ReplicateConfig, SoftPinAction, Store
from kvtest.pool import PoolFactory, pool  # noqa: F401

SIZE = 64 << 10


def test_a_soft_pinned_object_outlives_every_unpinned_one(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="1MiB", master_args=("--eviction-mode", "cache"))
    pinned = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=600_000)
    n = 96  # six times what the segment holds
    with Store(p.address) as s:
        assert s.put("pinned", b"p" * SIZE, pinned) is True
        for i in range(n):
            assert s.put(f"obj{i}", bytes([i]) * SIZE) is True, f"put {i} of {n} refused"
        descs = s.batch_get_replica_desc(["pinned", *(f"obj{i}" for i in range(n))])
        alive = [k for k, d in descs.items() if d and k != "pinned"]
        assert 0 < len(alive) < n // 4, "the pool was not filled past capacity"
        assert descs["pinned"], "the soft-pinned object went while unpinned ones stayed"
        assert s.get("pinned") == b"p" * SIZE
