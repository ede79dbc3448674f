"""The Store's own CPU per strict small operation, as instruction counts (repeatable on a noisy
machine): this process runs under valgrind's callgrind with collection off, starts a `kvpool
master` and a `kvpool node` (not under valgrind), opens a strict `Store` and, per phase, turns
collection on (`callgrind_control -i on` on its own PID), runs N calls of one kind, turns it off
and dumps. The master's side of the same calls is benchmarks/master_instructions.py.

    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/tmp/st.%p \\
        .venv/bin/python benchmarks/store_instructions.py [--n 2000]
    .venv/bin/python benchmarks/store_instructions.py --run [--n 2000]   # does the above

Prints instructions per call (per key for the batches of 64) of: get_into 4 KiB, put_from
4 KiB, batch_get_into 64 x 4 KiB, batch_put_from 64 x 4 KiB, a bare `RpcClient.call` of an
Echo (the RPC floor), and a 4 KiB put_from of a `write_mode="nowait"` Store. docs/parts/perf-master.md has a reading.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_TOTAL = re.compile(r"^totals:\s+(\d+)", re.M)
_SIZE = 4096
_BATCH = 64
_NODE_TAIL = ("--host", "127.0.0.1", "--no-progress")


def _ctl(*a: str) -> None:
    subprocess.run(["callgrind_control", *a, str(os.getpid())], check=True, capture_output=True)


def _measure(n: int) -> list[tuple[str, int]]:
    """Run the phases inside callgrind; (dump name, units) per phase, in order."""
    from kvpool import Store
    from kvpool.children import Child
    from kvpool.protocol.messages import Echo

    run = [sys.executable, "-m", "kvpool"]
    master = Child([*run, "master", "--host", "127.0.0.1", "--port", "0"], name="master")
    node: Child | None = None
    phases: list[tuple[str, int]] = []
    try:
        address = master.wait_ready(120)
        node = Child(
            [*run, "node", "--master", address, "--segment-size", str(1 << 30), *_NODE_TAIL],
            name="node",
        )
        node.wait_ready(120)
        # busy_poll=0: a reply awaited by polling would count the polls, whose number depends
        # on how fast the master answers a process slowed down by valgrind.
        fast = Store(master=address, segment_size=0, busy_poll=0, write_mode="nowait")
        with Store(master=address, segment_size=0, protocol="auto", busy_poll=0) as store, fast:
            store.warm_up()
            fast.warm_up()
            buf = bytearray(_SIZE * _BATCH)
            store.register_buffer(memoryview(buf))
            views = [memoryview(buf)[i * _SIZE : (i + 1) * _SIZE] for i in range(_BATCH)]
            one = views[0]
            nb = max(1, n // _BATCH)
            keys = [f"store-instr-{i:08d}" for i in range(n)]
            bkeys = [[f"store-instr-b{j:06d}-{i:02d}" for i in range(_BATCH)] for j in range(nb)]
            rpc = store._node.rpc  # the Store's own control connection

            def phase(name: str, count: int, units: int, op: Callable[[int], object]) -> None:
                for i in range(min(count, 20)):  # warm the path (not counted)
                    op(i)
                _ctl("-i", "on")
                for i in range(count):
                    op(i)
                _ctl("-i", "off")
                _ctl("-d", name)
                phases.append((name, units))

            phase("echo", n, n, lambda i: rpc.call(Echo(b"")))
            phase("put_from", n, n, lambda i: store.put_from(keys[i], one))
            phase("get_into", n, n, lambda i: store.get_into(keys[i], one))
            phase(
                "batch_put_from", nb, nb * _BATCH, lambda j: store.batch_put_from(bkeys[j], views)
            )
            phase(
                "batch_get_into", nb, nb * _BATCH, lambda j: store.batch_get_into(bkeys[j], views)
            )
            # (Not cached gets: their check for invalidations is rate-limited by time, and
            # valgrind's slowness would make it run on every call.)
            fast.register_buffer(memoryview(buf))
            fkeys = [f"store-instr-f{i:08d}" for i in range(n)]
            phase("nowait_put_from", n, n, lambda i: fast.put_from(fkeys[i], one))
    finally:
        if node is not None:
            node.stop()
        master.stop()
    return phases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="calls per single-key phase")
    ap.add_argument("--run", action="store_true", help="start this script under callgrind")
    ap.add_argument("--keep", default=None, help="copy the callgrind dumps into this directory")
    ap.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        phases = _measure(args.n)
        Path(args.inside).write_text("\n".join(f"{name} {units}" for name, units in phases))
        return
    if not args.run:
        ap.error("pass --run (this script starts itself under callgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        plan = out / "phases"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out}/cg.%p",
                sys.executable,
                __file__,
                "--n",
                str(args.n),
                "--inside",
                str(plan),
            ],
            check=True,
            capture_output=True,
        )
        phases = [line.split() for line in plan.read_text().splitlines()]
        dumps = sorted(out.glob("cg.*.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
        print("| phase | Store instructions per call (per key for batches) |")
        print("|---|---:|")
        for (name, units), dump in zip(phases, dumps, strict=False):
            found = _TOTAL.search(dump.read_text(errors="replace"))
            total = int(found.group(1)) if found else 0
            print(f"| {name} | {total / int(units):,.0f} |")
            if args.keep:
                Path(args.keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(dump, Path(args.keep) / f"{name}.callgrind")


if __name__ == "__main__":
    main()
