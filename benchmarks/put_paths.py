"""The Store's put paths and a lock-step get / exists, per call: wall time and this process's CPU
time (the client's own work: steadier than wall time on a loaded machine), against a real
`kvpool master` and a Store that contributes the memory. Made to compare two checkouts of the
same code (a refactoring that must not cost anything): run it under each tree in turn,

    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/put_paths.py --json out.json

in an A B B A order, and compare the medians (docs/parts/perf-store.md has a reading). Asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import kvpool
from kvpool import Store
from kvpool.children import Child


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default="", help="Also write the medians to this file.")
    args = ap.parse_args()
    n = args.calls
    py = [sys.executable, "-m", "kvpool"]
    master = Child([*py, "master", "--host", "127.0.0.1", "--port", "0"], name="master")
    try:
        address = master.wait_ready(60)
        small, big = b"s" * 4096, b"b" * (1 << 20)
        batch = [b"t" * 4096] * 64
        with Store(address, segment_size="1GiB") as store:
            for i in range(n):
                store.put(f"a{i}", small)
            cases: dict[str, Callable[[int], object]] = {
                "put 4 KiB (arena, PutCommit)": lambda i: store.put(f"p{i}", small),
                "upsert 4 KiB (PutStart/PutEnd)": lambda i: store.upsert(f"u{i % 100}", small),
                "upsert 1 MiB": lambda i: store.upsert(f"m{i % 20}", big),
                "batch_put 64 x 4 KiB": lambda i: store.batch_put(
                    [f"b{i}.{j}" for j in range(64)], batch
                ),
                "get 4 KiB": lambda i: store.get(f"a{i}"),
                "exists (one RPC)": lambda i: store.exists(f"a{i}"),
            }
            out: dict[str, dict[str, float]] = {}
            for name, fn in cases.items():
                calls = n // 8 if "64" in name or "MiB" in name else n
                wall: list[float] = []
                cpu: list[float] = []
                for i in range(calls):
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn(i)
                    wall.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                skip = calls // 10  # warm-up
                out[name] = {
                    "wall_p50_us": statistics.median(wall[skip:]) * 1e6,
                    "cpu_mean_us": statistics.fmean(cpu[skip:]) * 1e6,
                }
                print(
                    f"{name:32} wall p50 {out[name]['wall_p50_us']:8.1f} us   "
                    f"CPU mean {out[name]['cpu_mean_us']:8.1f} us"
                )
        print(f"(kvpool from {kvpool.__file__})")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(out, f)
    finally:
        master.stop()


if __name__ == "__main__":
    main()
