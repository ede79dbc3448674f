"""Batched DFS puts against key-by-key ones (docs/parts/perf-tiers.md, "Batched DFS puts"):
a real `kvpool master --dfs-root` on a temporary directory and a Store that contributes the
memory; per round, a 32-key `batch_put` with `dfs_replica_num=1` (one BatchPutStart, each
key's file written, one BatchPutEnd), the same keys put one by one with `put` (the path such
batches took before: a PutStart / file / PutEnd per key), and a plain batch without a DFS copy,
interleaved round after round. Prints the median wall time per batch (ms) and the ratios.
Asserts nothing.

    .venv/bin/python benchmarks/dfs_batch.py --rounds 40 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

from kvpool import Store
from kvpool.children import Child
from kvpool.client.replicate import ReplicateConfig

KEYS = 32
DFS = ReplicateConfig(dfs_replica_num=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", default="", help="Also write the medians to this file.")
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kvpool-dfs-bench-") as root:
        py = [sys.executable, "-m", "kvpool"]
        master = Child(
            [*py, "master", "--host", "127.0.0.1", "--port", "0", "--dfs-root", root],
            name="master",
        )
        try:
            address = master.wait_ready(60)
            with Store(address, segment_size="512MiB") as store:
                for size in (4096, 64 << 10):
                    out[str(size)] = _sizes(store, size, args.rounds)
        finally:
            master.stop()
    for size, row in out.items():
        print(
            f"{int(size) >> 10:>4} KiB x {KEYS}: batched {row['batched_ms']:.2f} ms, "
            f"key by key {row['each_ms']:.2f} ms ({row['each_ms'] / row['batched_ms']:.2f}x), "
            f"no DFS copy {row['plain_ms']:.2f} ms"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def _sizes(store: Store, size: int, rounds: int) -> dict[str, float]:
    value = b"d" * size
    values = [value] * KEYS
    batched: list[float] = []
    each: list[float] = []
    plain: list[float] = []
    for r in range(-2, rounds):  # two warm-up rounds
        keys = [f"b{size}-{r}-{i}" for i in range(KEYS)]
        t = time.perf_counter()
        assert store.batch_put(keys, values, DFS) == [0] * KEYS
        t_batched = time.perf_counter() - t
        keys = [f"e{size}-{r}-{i}" for i in range(KEYS)]
        t = time.perf_counter()
        for k in keys:
            assert store.put(k, value, DFS)
        t_each = time.perf_counter() - t
        keys = [f"p{size}-{r}-{i}" for i in range(KEYS)]
        t = time.perf_counter()
        assert store.batch_put(keys, values) == [0] * KEYS
        t_plain = time.perf_counter() - t
        if r >= 0:
            batched.append(t_batched)
            each.append(t_each)
            plain.append(t_plain)
        store.remove_all(force=True)
    return {
        "batched_ms": statistics.median(batched) * 1000,
        "each_ms": statistics.median(each) * 1000,
        "plain_ms": statistics.median(plain) * 1000,
    }


if __name__ == "__main__":
    main()
