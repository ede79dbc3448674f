"""The transfer server's per-request path: lock-step 4 KiB TCP writes and reads and 16 MiB
writes through an in-process `TransferServer` and `TransferEngine` (no credentials, no TLS),
for whatever kvpool the interpreter imports, so that two checkouts compare in one run:

    for i in 1 2 3; do
        PYTHONPATH=BEFORE/src .venv/bin/python benchmarks/transfer_hot_path.py before
        .venv/bin/python benchmarks/transfer_hot_path.py after
    done

(BEFORE: a checkout of the commit to compare with.)

Prints one table row per run (medians of 5 rounds); asserts nothing.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from kvpool.transfer import (
    SegmentLocation,
    SegmentMemory,
    TransferEngine,
    TransferOp,
    TransferRequest,
    TransferServer,
)

MiB = 1 << 20


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    mem = SegmentMemory.create("hot", 64 * MiB)
    server = TransferServer()
    server.add_segment(mem)
    loc = SegmentLocation("hot", 64 * MiB, "elsewhere", server.endpoint, "")
    engine = TransferEngine(lambda _n: loc, "tcp")
    small = bytearray(os.urandom(4096))
    big = bytearray(os.urandom(16 * MiB))

    def rate(op: TransferOp, buf: bytearray, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            engine.transfer([TransferRequest(op, buf, "hot", 0)])
        return n / (time.perf_counter() - t0)

    try:
        rate(TransferOp.WRITE, small, 500)
        writes = statistics.median(rate(TransferOp.WRITE, small, 3000) for _ in range(5))
        reads = statistics.median(rate(TransferOp.READ, small, 3000) for _ in range(5))
        gbps = statistics.median(rate(TransferOp.WRITE, big, 10) * 16 * MiB / 1e9 for _ in range(5))
        print(f"| {label} | {writes / 1000:.1f}k/s | {reads / 1000:.1f}k/s | {gbps:.2f} GB/s |")
    finally:
        engine.close()
        server.close()
        mem.close()


if __name__ == "__main__":
    main()
