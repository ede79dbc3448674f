"""CPU per strict small operation, on both sides: the Store's process and the master's.

Starts a `kvpool master` and a `kvpool node` (one shared-memory segment), opens a strict
`Store` here (today's default semantics: every get asks the master, every put waits for its
commit) and runs N lock-step operations of each small kind: 4 KiB get_into, put_from, and
64-key batch_get_into / batch_put_from. For each it reports the CPU time (user + system) per
call of this process and of the master (from /proc/PID/stat), which is far steadier than wall
time on a shared machine, and the wall p50.

    .venv/bin/python benchmarks/strict_cpu.py [--n 4000] [--src DIR] [--profile get]

`--src DIR` runs the master and node from another checkout's `src` (PYTHONPATH) for a
before/after in one session (the Store always comes from this process's import path; run this
script with `PYTHONPATH=DIR` to change it too). `--profile KIND` prints the Store side's
cProfile of that kind. docs/parts/perf-master.md has the readings.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

from kvpool.children import Child

_TICK = os.sysconf("SC_CLK_TCK")
_SIZE = 4096
_BATCH = 64
_NODE_TAIL = ("--host", "127.0.0.1", "--no-progress")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000, help="calls per single-key kind")
    ap.add_argument("--src", default=None, help="run the master and node from this src")
    ap.add_argument("--profile", default=None, help="cProfile the Store side of this kind")
    ap.add_argument("--master-profile", default=None, help="cProfile the master into this file")
    ap.add_argument("--kinds", default="put,get,batch put,batch get", help="which kinds to run")
    args = ap.parse_args()
    from kvpool import Store

    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = args.src
    run = [sys.executable, "-m", "kvpool"]
    prof_args = ["-m", "cProfile", "-o", args.master_profile] if args.master_profile else []
    mrun = [sys.executable, *prof_args, "-m", "kvpool"]
    # Busy polling off on both ends: this measures the CPU of the requests themselves
    # (benchmarks/busy_poll.py measures what polling costs and saves). A tree from before it
    # (--src) has no such option.
    margs = ["master", "--host", "127.0.0.1", "--port", "0"]
    margs += [] if args.src else ["--busy-poll-us", "0"]
    quiet = {"busy_poll": 0} if "busy_poll" in inspect.signature(Store).parameters else {}
    master = Child([*mrun, *margs], name="master", env=env)
    node: Child | None = None
    try:
        address = master.wait_ready(60)
        node = Child(
            [*run, "node", "--master", address, "--segment-size", str(1 << 30), *_NODE_TAIL],
            name="node",
            env=env,
        )
        node.wait_ready(60)
        n = args.n
        nb = max(1, n // 8)
        with Store(master=address, segment_size=0, protocol="auto", **quiet) as store:
            store.warm_up()
            buf = bytearray(_SIZE * _BATCH)
            store.register_buffer(memoryview(buf))
            views = [memoryview(buf)[i * _SIZE : (i + 1) * _SIZE] for i in range(_BATCH)]
            one = views[0]
            keys = [f"strict-cpu-{i:08d}" for i in range(n)]
            bkeys = [[f"strict-cpu-b{j:06d}-{i:02d}" for i in range(_BATCH)] for j in range(nb)]

            def put() -> Callable[[int], object]:
                return lambda i: store.put_from(keys[i], one)

            kinds: list[tuple[str, int, Callable[[int], object]]] = [
                ("put 4 KiB", n, put()),
                ("get 4 KiB", n, lambda i: store.get_into(keys[i], one)),
                ("batch put 64 x", nb, lambda j: store.batch_put_from(bkeys[j], views)),
                ("batch get 64 x", nb, lambda j: store.batch_get_into(bkeys[j], views)),
            ]
            print(f"{'kind':<14}{'calls':>7}{'store us':>10}{'master us':>11}{'p50 us':>9}")
            wanted = args.kinds.split(",")
            for name, count, op in kinds:
                if name.rsplit(" ", 2)[0] not in wanted:
                    continue
                prof = cProfile.Profile() if args.profile and args.profile in name else None
                walls: list[float] = []
                m0, s0 = _cpu(master.pid), _self_cpu()
                if prof is not None:
                    prof.enable()
                for i in range(count):
                    t0 = time.perf_counter()
                    op(i)
                    walls.append(time.perf_counter() - t0)
                if prof is not None:
                    prof.disable()
                s1, m1 = _self_cpu(), _cpu(master.pid)
                print(
                    f"{name:<14}{count:>7}{(s1 - s0) / count * 1e6:>10.1f}"
                    f"{(m1 - m0) / count * 1e6:>11.1f}{statistics.median(walls) * 1e6:>9.1f}"
                )
                if prof is not None:
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    finally:
        if node is not None:
            node.stop()
        master.stop()


if __name__ == "__main__":
    main()
