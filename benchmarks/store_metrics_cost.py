"""The cost of Store-side counters (`Store(..., metrics=True)`): lock-step 4 KiB get, put and
64-key batch_get through two Stores on one pool, one with counters and one without, in
interleaved rounds (off, on, off, on, ...), against a real `kvpool master` and node.

    .venv/bin/python benchmarks/store_metrics_cost.py [--rounds 7] [--calls 3000]

Prints a table of medians per call: wall time and this process's CPU time (the client's own
work, what counters add to; steadier than wall time on a loaded machine), with on/off ratios;
asserts nothing (docs/parts/perf-ops.md has a reading).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from kvpool import Store
from kvpool.children import Child


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    py = [sys.executable, "-m", "kvpool"]
    master = Child([*py, "master", "--host", "127.0.0.1", "--port", "0"], name="master")
    node: Child | None = None
    try:
        address = master.wait_ready(60)
        node = Child([*py, "node", "--master", address, "--segment-size", "256MiB"], name="node")
        node.wait_ready(60)
        value = b"v" * 4096
        keys = [f"k{i}" for i in range(args.calls)]
        with Store(address) as off, Store(address, metrics=True) as on:
            for k in keys:
                off.put(k, value)
            cases: dict[str, Callable[[Store], None]] = {
                "get 4 KiB": lambda s: [s.get(k) for k in keys] and None,
                "put 4 KiB": lambda s: [s.upsert(k, value) for k in keys] and None,
                "batch_get 64 x 4 KiB": lambda s: (
                    [s.batch_get(keys[i : i + 64]) for i in range(0, len(keys), 64)] and None
                ),
            }
            calls = {"get 4 KiB": len(keys), "put 4 KiB": len(keys)}
            calls["batch_get 64 x 4 KiB"] = (len(keys) + 63) // 64
            print("| case | wall off us | wall on us | on/off | CPU off us | CPU on us | on/off |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for name, fn in cases.items():
                times: dict[str, list[float]] = {"off": [], "on": []}
                cpu: dict[str, list[float]] = {"off": [], "on": []}
                fn(off)
                fn(on)
                for _ in range(args.rounds):
                    for label, store in (("off", off), ("on", on)):
                        t0, c0 = time.perf_counter(), time.process_time()
                        fn(store)
                        n = calls[name]
                        times[label].append((time.perf_counter() - t0) / n * 1e6)
                        cpu[label].append((time.process_time() - c0) / n * 1e6)
                a, b = statistics.median(times["off"]), statistics.median(times["on"])
                c, d = statistics.median(cpu["off"]), statistics.median(cpu["on"])
                print(
                    f"| {name} | {a:.1f} | {b:.1f} | {b / a:.3f} | {c:.1f} | {d:.1f} | {d / c:.3f} |"
                )
    finally:
        if node is not None:
            node.stop()
        master.stop()


if __name__ == "__main__":
    main()
