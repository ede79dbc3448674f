"""`kvpool bench tiers`, its promotion phase: how soon a re-read hot set is back in memory.

A master with `--offload-policy on-evict --promotion-on-hit --promotion-admission-threshold 2`,
a Store here that owns the memory and a disk tier, and a same-host client Store. The client
writes three times the memory in 1 MiB objects, so the first ones end on the disk tier only;
a hot set of them is then read in rounds (each key once per round) until every hot key has a
memory replica again (promotion on hit: the master counts the reads of disk-only objects and,
past the threshold, has the owner copy them back). Metrics (JSON rows):

* `promotion_seconds`: from the first read of the hot set until all of it is in memory;
* `promotion_rounds`: the rounds of reads that took;
* `promoted_get_vs_memory`: the p50 time of a get of the hot set once promoted over the p50
  time of a get of objects just written (in memory), same run (1.0: memory speed; 2.0: twice
  as slow);
* `disk_get_vs_memory`: the same ratio for the hot set's first round, read from the disk tier.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kvpool.bench.rows import percentile
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.store import Store
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import ReplicaKind

__all__ = ["promotion_rows"]

MiB = 1 << 20
HOT = 16
"""Keys of the hot set."""
SAMPLES = 4
"""Gets of each key for the p50s compared (the hot set and the memory baseline)."""
DEADLINE_S = 60.0
"""The longest the hot set may take to come back (the phase fails past it)."""


def _value(i: int) -> bytes:
    return i.to_bytes(8, "little") * (MiB // 8)


def _kinds(store: Store, key: str) -> set[ReplicaKind]:
    return {ReplicaKind(r.kind) for r in store.get_replica_desc(key)}


def _timed_gets(store: Store, keys: list[str], values: dict[str, bytes]) -> list[float]:
    times: list[float] = []
    for k in keys:
        t = time.perf_counter()
        got = store.get(k)
        times.append(time.perf_counter() - t)
        if got != values[k]:
            raise KVPoolError(f"{k} read back wrong")
        del got
    return times


def promotion_rows(memory: int, disk: int, root: str) -> list[dict[str, Any]]:
    """Run the promotion phase in `root` (a directory it may fill); its metric rows."""
    pool = EmbeddedPool(
        PoolSpec(
            segment_size=0,
            nodes=0,
            master_args=(
                "--offload-policy",
                "on-evict",
                "--promotion-on-hit",
                "--promotion-admission-threshold",
                "2",
            ),
        )
    )
    try:
        address = pool.start()
        with (
            Store(  # the owner of the memory and the disk tier: it serves, the client reads
                address,
                segment_size=memory,
                offload_dir=os.path.join(root, "promotion-disk"),
                offload_size=disk,
                rpc_timeout=60.0,
            ),
            Store(address, rpc_timeout=60.0) as client,
        ):
            n = 3 * memory // MiB
            keys = [f"p{i}" for i in range(n)]
            values = {k: _value(i) for i, k in enumerate(keys)}
            for k in keys:
                client.put(k, values[k])
            # The oldest objects are on disk only. Only they are asked about: a GetReplicaList
            # (and a get) leases what it names, and a leased object is not evicted to make
            # room for a promotion until its lease runs out.
            hot = keys[:HOT]
            if not all(_kinds(client, k) == {ReplicaKind.LOCAL_DISK} for k in hot):
                raise KVPoolError("the oldest objects did not go to the disk tier")
            start = time.perf_counter()
            first = percentile(_timed_gets(client, hot, values), 0.5)
            rounds = 1
            while not all(ReplicaKind.MEMORY in _kinds(client, k) for k in hot):
                if time.perf_counter() - start > DEADLINE_S:
                    raise KVPoolError(f"the hot set was not promoted within {DEADLINE_S:.0f} s")
                _timed_gets(client, hot, values)
                rounds += 1
            took = time.perf_counter() - start
            promoted = percentile(_timed_gets(client, hot * SAMPLES, values), 0.5)
            # The memory baseline: objects written now, read at once (in memory).
            fresh = [f"m{i}" for i in range(HOT)]
            for i, k in enumerate(fresh):
                values[k] = _value(n + i)
                client.put(k, values[k])
            memory_get = percentile(_timed_gets(client, fresh * SAMPLES, values), 0.5)
    finally:
        pool.close()
    row = {"system": "kvpool", "path": "promotion", "objects": HOT, "value_size": MiB}
    return [
        {**row, "metric": "promotion_seconds", "value": took},
        {**row, "metric": "promotion_rounds", "value": rounds},
        {**row, "metric": "promoted_get_vs_memory", "value": promoted / memory_get},
        {**row, "metric": "disk_get_vs_memory", "value": first / memory_get},
    ]
