"""Measure durable metadata in-process: the numbers of docs/parts/perf-ha.md.

    .venv/bin/python tests/master/measure_durable.py [--objects 1000000] [--puts 20000]

1. Per-put cost on the service (no sockets): 64-key BatchPutStart + BatchPutEnd, and single
   PutStart + PutEnd, each request's records written as the server does (`OpLog.flush`),
   without and with a data directory (best of 3 rounds).
2. With `--objects` objects (one 4 KiB replica each): log bytes per object, the loop's pause of
   a snapshot (`Durability.snapshot`: the log rotation and the `fork()`; the log synced first,
   as the server's tick keeps it), the child's writing time, snapshot bytes per object, and a
   restart (load the snapshot, rebuild, write the new snapshot).
Not a test: it asserts nothing but the object count after the restart.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import tempfile
import time

from kvpool.master.config import MasterConfig
from kvpool.master.service import MasterService
from kvpool.protocol import messages as m

W = m.ClientId("writer")


def service(data_dir: str | None) -> MasterService:
    svc = MasterService(MasterConfig(data_dir=data_dir, client_ttl=3600, seed=1))
    info = m.SegmentInfo(m.SegmentName("s"), 64 << 30, m.HostId("h"), "127.0.0.1:1", "", "", 5)
    svc.handle(m.MountSegment(m.ClientId("n"), m.HostId("h"), info))
    return svc


def per_put(data_dir: str | None, n: int) -> tuple[float, float]:
    svc = service(data_dir)
    durable = svc.durable

    def flush() -> None:
        if durable is not None:
            durable.log.flush()

    batch: list[float] = []
    single: list[float] = []
    for rnd in range(3):
        keys = [f"{rnd}-key-{i:020d}" for i in range(n)]
        t = time.perf_counter()
        for i in range(0, n, 64):
            chunk = keys[i : i + 64]
            svc.handle(m.BatchPutStart(W, chunk, [4096] * len(chunk)))
            flush()
            svc.handle(m.BatchPutEnd(W, chunk, [7] * len(chunk)))
            flush()
        batch.append((time.perf_counter() - t) / n * 1e6)
        t = time.perf_counter()
        for k in keys[: n // 4]:
            svc.handle(m.PutStart(W, "x" + k, 4096))
            flush()
            svc.handle(m.PutEnd(W, "x" + k, 7))
            flush()
        single.append((time.perf_counter() - t) / (n // 4) * 1e6)
    if durable is not None:
        durable.close()
    return min(batch), min(single)


def snapshot_and_restart(n: int) -> None:
    d = tempfile.mkdtemp(prefix="kvpool-durable-")
    try:
        svc = service(d)
        durable = svc.durable
        assert durable is not None
        t = time.perf_counter()
        for i in range(0, n, 1000):
            keys = [f"key-{j:026d}" for j in range(i, min(n, i + 1000))]
            svc.handle(m.BatchPutStart(W, keys, [4096] * len(keys)))
            svc.handle(m.BatchPutEnd(W, keys, [7] * len(keys)))
            durable.log.flush()
        fill = time.perf_counter() - t
        gc.freeze()  # as the server's monitor does every second
        log_bytes = os.path.getsize(os.path.join(d, "log-00000001.kvp"))
        pauses = []
        child = 0.0
        for _ in range(3):
            durable.log.sync()
            t = time.perf_counter()
            assert durable.snapshot()
            pauses.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            while not durable.poll():
                time.sleep(0.005)
            child = time.perf_counter() - t
        (snap,) = [f for f in os.listdir(d) if f.startswith("snapshot")]
        snap_bytes = os.path.getsize(os.path.join(d, snap))
        durable.close()
        t = time.perf_counter()
        again = MasterService(MasterConfig(data_dir=d, client_ttl=3600, seed=1))
        restart = time.perf_counter() - t
        assert len(again.index) == n, len(again.index)
        assert again.durable is not None
        again.durable.close()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n:,} objects: filled at {n / fill:,.0f} keys/s; log {log_bytes / n:.0f} B/object; "
            f"snapshot pause (rotate + fork) {', '.join(f'{p:.1f}' for p in pauses)} ms; "
            f"child wrote the snapshot in {child:.2f} s, {snap_bytes / n:.0f} B/object; "
            f"restart {restart:.2f} s; max RSS {rss:.0f} MiB"
        )
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--puts", type=int, default=20_000)
    args = ap.parse_args()
    without = per_put(None, args.puts)
    d = tempfile.mkdtemp(prefix="kvpool-durable-")
    try:
        with_dir = per_put(d, args.puts)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    for name, (b, s) in (("without --data-dir", without), ("with --data-dir   ", with_dir)):
        print(f"{name}: {b:.2f} us/key in 64-key batches, {s:.2f} us per single put")
    print(
        f"overhead: {with_dir[0] - without[0]:+.2f} us/key batched, "
        f"{with_dir[1] - without[1]:+.2f} us per single put (PutStart + PutEnd)"
    )
    snapshot_and_restart(args.objects)


if __name__ == "__main__":
    main()
