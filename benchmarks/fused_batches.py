"""Batches of large values with and without the fused copy, in one process (an A/B).

One `kvpool master`, one `kvpool node` (1 GiB segment) and one Store in this process. Each
round puts 24 batches of `--batch` values of `--size` (`batch_put_from`, registered buffers)
and reads them back (`batch_get_into`), once with the fused copy (`kvpool.transfer.native`,
which batches use for puts from `FUSED_MIN` and gets from `CHUNKED_MIN`) and once without it
(`kvpool.client.datapath.copy_xxh3` set to None: the Python copy-then-hash), in turn; prints the median over `--rounds` of each round's median call.
`--fast` runs the Store in its fast modes (cached reads, nowait writes). Every batch's codes and
sizes are checked; the bytes are the tests' business (tests/client/test_copy_speed.py).

    .venv/bin/python benchmarks/fused_batches.py [--size 1MiB] [--batch 16] [--rounds 7] [--fast]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from kvpool import Store
from kvpool.bench.peers.workload import page_aligned
from kvpool.children import Child
from kvpool.client import datapath
from kvpool.config import parse_size
from kvpool.transfer import native

_CALLS = 24
_NODE_TAIL = ("--host", "127.0.0.1", "--no-progress")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--size", default="1MiB")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fast", action="store_true", help="cached reads and nowait writes")
    args = ap.parse_args()
    size, batch = parse_size(args.size), args.batch
    run = [sys.executable, "-m", "kvpool"]
    master = Child([*run, "master", "--host", "127.0.0.1", "--port", "0"], name="master")
    node: Child | None = None
    try:
        address = master.wait_ready(60)
        node = Child(
            [*run, "node", "--master", address, "--segment-size", "1GiB", *_NODE_TAIL],
            name="node",
        )
        node.wait_ready(60)
        modes = {"read_mode": "cached", "write_mode": "nowait"} if args.fast else {}
        with Store(master=address, segment_size=0, protocol="auto", **modes) as s:  # type: ignore[arg-type]
            _measure(s, size, batch, args.rounds)
    finally:
        if node is not None:
            node.stop()
        master.stop()


def _measure(s: Store, size: int, batch: int, rounds: int) -> None:
    s.warm_up()
    span = 4 * batch
    src = page_aligned(size * span)
    src[:] = np.random.default_rng(1).integers(0, 256, src.size, dtype=np.uint8)
    out = page_aligned(size * batch)
    out.fill(0)
    s.register_buffer(memoryview(src))
    s.register_buffer(memoryview(out))
    outs = [memoryview(out)[j * size : (j + 1) * size] for j in range(batch)]
    fused = datapath.copy_xxh3  # type: ignore[attr-defined]
    if fused is None:
        raise SystemExit(f"the fused copy is {native.copy_path}: nothing to compare")
    medians: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(rounds):
            for label, way in (("python", None), ("fused", fused)):
                datapath.copy_xxh3 = way  # type: ignore[attr-defined]
                s.flush()
                s.remove_all(force=True)
                puts, gets = [], []
                for i in range(_CALLS):
                    views = [
                        memoryview(src)[((i + j) % span) * size : ((i + j) % span + 1) * size]
                        for j in range(batch)
                    ]
                    keys = [f"{label}{r}_{i}_{j}" for j in range(batch)]
                    t = time.perf_counter()
                    codes = s.batch_put_from(keys, views)
                    puts.append(time.perf_counter() - t)
                    if any(codes):
                        raise SystemExit(f"batch_put_from: {codes}")
                s.flush()
                for i in range(_CALLS):
                    keys = [f"{label}{r}_{i}_{j}" for j in range(batch)]
                    t = time.perf_counter()
                    sizes = s.batch_get_into(keys, outs)
                    gets.append(time.perf_counter() - t)
                    if list(sizes) != [size] * batch:
                        raise SystemExit(f"batch_get_into: {sizes}")
                medians.setdefault((label, "put"), []).append(statistics.median(puts))
                medians.setdefault((label, "get"), []).append(statistics.median(gets))
    finally:
        datapath.copy_xxh3 = fused  # type: ignore[attr-defined]
    print(f"{batch} x {size >> 10} KiB per batch, {rounds} rounds x {_CALLS} calls")
    print("| op | Python copy, then xxh3 | fused |")
    print("|---|--:|--:|")
    for op in ("put", "get"):
        py = statistics.median(medians["python", op]) * 1e6
        fu = statistics.median(medians["fused", op]) * 1e6
        print(f"| batch {op} | {py:,.0f} µs | {fu:,.0f} µs |")


if __name__ == "__main__":
    main()
