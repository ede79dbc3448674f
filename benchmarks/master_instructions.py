"""The master's own CPU per request kind, as instruction counts (repeatable on a noisy machine,
where CPU time is not): a `kvpool master` under valgrind's callgrind with collection off; each
phase turns it on (`callgrind_control -i on`), sends N lock-step requests of one kind from this
process, turns it off and dumps, so each dump holds one phase. An `idle` phase (2 s of nothing)
measures the background tasks, whose share is subtracted by the phase's wall time.

    .venv/bin/python benchmarks/master_instructions.py [--n 2000] [--src DIR] [--keep DIR]

`--src DIR` runs the master from another checkout's `src` (PYTHONPATH), for before/after in one
session. Needs valgrind. Prints a table (instructions per request, or per key for the batches of
64); docs/parts/perf-master.md has a reading. The phases: Echo, PutCommit (into an arena),
GetReplicaList, BatchPutCommit of 64, BatchGetLocations of 64, against a master with reclaim
on (the default) and a metadata-only segment of 16 TiB.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvpool.bench.master import HOST, NODE, OBJECT_SIZE, SEGMENT, SEGMENT_SIZE, WRITER, _keys
from kvpool.children import Child
from kvpool.protocol import messages as m
from kvpool.rpc.client import RpcClient

_TOTAL = re.compile(r"^totals:\s+(\d+)", re.M)


def _instructions(path: Path) -> int:
    found = _TOTAL.search(path.read_text(errors="replace"))
    return int(found.group(1)) if found else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="requests per single-key phase")
    ap.add_argument("--src", default=None, help="run the master from this src directory")
    ap.add_argument("--keep", default=None, help="copy the callgrind dumps into this directory")
    args = ap.parse_args()
    n = args.n
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = args.src
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}/cg.%p",
            sys.executable,
            "-m",
            "kvpool",
            "master",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--client-ttl",
            "1h",
        ]
        # Busy polling off (its polls would be counted), where the master has it.
        cli = Path(args.src or Path(__file__).parents[1] / "src") / "kvpool/cli/master.py"
        if "--busy-poll-us" in cli.read_text():
            cmd += ["--busy-poll-us", "0"]
        master = Child(cmd, name="master under callgrind", env=env)
        try:
            address = master.wait_ready(600)
            rpc = RpcClient(address, response_type=m.Response, timeout=600, client_name="bench")
            info = m.SegmentInfo(SEGMENT, SEGMENT_SIZE, HOST, "127.0.0.1:1", "")
            rpc.call(m.MountSegment(NODE, HOST, info))
            keys = _keys("k", n)
            bkeys = _keys("b", n)
            arena = rpc.call(m.ReserveArena(WRITER, 64 << 20, 64 << 20))
            barena = rpc.call(m.ReserveArena(WRITER, 64 << 20, 64 << 20))
            walls: dict[str, float] = {}
            per: dict[str, int] = {}

            def ctl(*a: str) -> None:
                subprocess.run(
                    ["callgrind_control", *a, str(master.pid)], check=True, capture_output=True
                )

            def phase(name: str, units: int, run: Callable[[], None]) -> None:
                for _ in range(50):
                    rpc.call(m.Echo(b""))
                ctl("-i", "on")
                t0 = time.perf_counter()
                run()
                walls[name] = time.perf_counter() - t0
                ctl("-i", "off")
                ctl(
                    "-d", name.split(" ", maxsplit=1)[0]
                )  # (a dump reason with spaces is not taken)
                per[name] = units

            def bcommit() -> None:
                for j in range(n // 64):
                    ks = bkeys[j * 64 : (j + 1) * 64]
                    offs = [barena.offset + (j * 64 + i) * OBJECT_SIZE for i in range(64)]
                    r = rpc.call(
                        m.BatchPutCommit(
                            WRITER, barena.arena_id, ks, [OBJECT_SIZE] * 64, offs, [1] * 64
                        )
                    )
                    assert r.codes == [0] * 64, r

            phase("idle", 1, lambda: time.sleep(2.0))
            phase("echo", n, lambda: [rpc.call(m.Echo(b"")) for _ in range(n)] and None)
            phase(
                "put_commit",
                n,
                lambda: (
                    [
                        rpc.call(
                            m.PutCommit(
                                WRITER,
                                k,
                                OBJECT_SIZE,
                                arena.arena_id,
                                arena.offset + i * OBJECT_SIZE,
                                i,
                            )
                        )
                        for i, k in enumerate(keys)
                    ]
                    and None
                ),
            )
            phase(
                "get_replica_list",
                n,
                lambda: [rpc.call(m.GetReplicaList(k)) for k in keys] and None,
            )
            pkeys = _keys("p", n)
            qkeys = _keys("q", n)

            def put(ks: list[str], window: int) -> None:
                for i in range(0, len(ks), window):
                    part = ks[i : i + window]
                    got = rpc.call_many([m.PutStart(WRITER, k, OBJECT_SIZE) for k in part])
                    assert all(r.code == 0 for r in got), got[0]
                    ends = rpc.call_many([m.PutEnd(WRITER, k, 1) for k in part])
                    assert all(r.code == 0 for r in ends), ends[0]

            phase("put (PutStart+PutEnd)", n, lambda: put(pkeys, 1))
            phase("put pipelined (64)", n, lambda: put(qkeys, 64))
            phase(
                "get_replica_list pipelined (64)",
                n,
                lambda: (
                    [
                        rpc.call_many([m.GetReplicaList(k) for k in keys[i : i + 64]])
                        for i in range(0, n, 64)
                    ]
                    and None
                ),
            )
            phase("batch_put_commit (per key)", n // 64 * 64, bcommit)
            phase(
                "batch_get_locations (per key)",
                n // 64 * 64,
                lambda: (
                    [
                        rpc.call(m.BatchGetLocations(keys[i : i + 64]))
                        for i in range(0, n // 64 * 64, 64)
                    ]
                    and None
                ),
            )
            rpc.close()
        finally:
            master.stop(grace=60)
        dumps = sorted(out.glob("cg.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        if args.keep:
            # One file per phase, named after it, for callgrind_annotate.
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            for name, dump in zip(per, dumps, strict=False):
                shutil.copy(dump, keep / f"{name.split(' ', maxsplit=1)[0]}.callgrind")
        if os.environ.get("KVPOOL_BENCH_DEBUG"):
            print([(p.name, _instructions(p)) for p in dumps])
        names = list(per)
        counts = dict(zip(names, (_instructions(p) for p in dumps), strict=False))
        idle_rate = counts.get("idle", 0) / max(walls.get("idle", 1.0), 1e-9)
        print(f"idle master: {idle_rate:,.0f} instructions per second (its background tasks)")
        print("| phase | instructions per request (key) | of which background |")
        print("|---|---:|---:|")
        for name in names[1:]:
            background = idle_rate * walls[name]
            value = (counts.get(name, 0) - background) / per[name]
            print(f"| {name} | {value:,.0f} | {background / per[name]:,.0f} |")


if __name__ == "__main__":
    main()
