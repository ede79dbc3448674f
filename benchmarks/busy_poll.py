"""Busy polling on and off, side by side (docs/parts/perf-rpc.md, "Busy polling").

Part 1, the wake-up itself: a `sendall` of a 120-byte frame on a Unix socket pair to a reader
process that sleeps in `epoll_wait` against one that polls with non-blocking `recv`; the
sender then spins 80 µs (a 1 MiB copy's time) before the next frame, as a Store's nowait puts
do. Part 2, the pool: one `kvpool master` + `kvpool node` per setting (`--busy-poll-us` of the
master, `Store(busy_poll=...)` of the client; "off" is 0 and 0, "on" the defaults), Stores
over shared memory, rounds alternating between the pools so both meet the same machine:
strict 4 KiB `get_into` / `put_from`, strict 64 x 4 KiB `batch_get_into` / `batch_put_from`,
and `read_mode="cached"` + `write_mode="nowait"` 1 MiB `get_into` / `put_from`. Per row: p50
and throughput (median over rounds) of each setting, on ÷ off, and the CPU time per call of
the master process and of this process (`/proc/PID/stat`, `getrusage`). Every value read is
compared with what was put. Asserts nothing.

    .venv/bin/python benchmarks/busy_poll.py [--rounds 12] [--calls 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kvpool import Store
from kvpool.children import Child

SETTINGS = {"off": (0, 0.0), "on": (200, 50e-6)}  # name: (--busy-poll-us, Store busy_poll)
KiB, MiB = 1 << 10, 1 << 20


def wakeup_cost(sends: int = 3000) -> dict[str, float]:
    """p50 µs of a sendall to a reader asleep in epoll and to one polling (part 1)."""
    out = {}
    for mode in ("sleeps", "polls"):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # the reader: until the sender closes
            a.close()
            ep = select.epoll()
            ep.register(b.fileno(), select.EPOLLIN)
            while True:
                if mode == "polls":
                    try:
                        data = b.recv(65536, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                else:
                    ep.poll()
                    data = b.recv(65536)
                if not data:
                    os._exit(0)
        b.close()
        frame = b"x" * 120
        times = []
        try:
            for _ in range(sends):
                t = time.perf_counter()
                a.sendall(frame)
                times.append(time.perf_counter() - t)
                t = time.perf_counter()
                while time.perf_counter() - t < 80e-6:
                    pass
        finally:
            a.close()
            os.waitpid(pid, 0)
        out[mode] = statistics.median(times) * 1e6
    return out


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Pool:
    """A master and a node started with one setting, and two Stores on them."""

    def __init__(self, name: str, master_us: int, store_poll: float) -> None:
        self.name = name
        self.children: list[Child] = []
        self.stores: list[Store] = []
        try:
            m = self._child("master", "--busy-poll-us", str(master_us))
            address = m.wait_ready(timeout=60)
            self.master_pid = m.pid
            self._child("node", "--master", address, "--segment-size", "1GiB").wait_ready(60)
            self.strict = self._store(address, store_poll)
            self.fast = self._store(address, store_poll, read_mode="cached", write_mode="nowait")
        except BaseException:
            self.close()
            raise

    def _child(self, *args: str) -> Child:
        argv = [sys.executable, "-m", "kvpool", args[0], "--host", "127.0.0.1", *args[1:]]
        if args[0] == "master":
            argv += ["--port", "0"]
        else:
            argv += ["--no-progress"]
        child = Child(argv, name=f"{self.name} {args[0]}")
        self.children.append(child)
        return child

    def _store(self, address: str, poll: float, **modes: str) -> Store:
        s = Store(address, busy_poll=poll, **modes)
        self.stores.append(s)
        s.warm_up()
        return s

    def close(self) -> None:
        for s in self.stores:
            s.close()
        for c in reversed(self.children):
            c.stop()


def _aligned(n: int, fill: bytes) -> memoryview:
    raw = np.empty(n + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    view = memoryview(raw[off : off + n])
    view[:] = (fill * (n // len(fill) + 1))[:n]
    return view


Row = tuple[str, str, int, int]  # (label, op, size, batch)
ROWS: list[Row] = [
    ("strict", "get", 4 * KiB, 1),
    ("strict", "put", 4 * KiB, 1),
    ("strict", "get", 4 * KiB, 64),
    ("strict", "put", 4 * KiB, 64),
    ("fast", "get", MiB, 1),
    ("fast", "put", MiB, 1),
]


def _round(pool: Pool, row: Row, calls: int, tag: str) -> tuple[list[float], float, float, float]:
    """Times of `calls` calls of `row`, their wall time, master CPU and own CPU (seconds)."""
    label, op, size, batch = row
    s = pool.strict if label == "strict" else pool.fast
    src = _aligned(size * batch, os.urandom(64))
    dst = _aligned(size * batch, b"\0")
    s.register_buffer(src)
    s.register_buffer(dst)
    srcs = [src[i * size : (i + 1) * size] for i in range(batch)]
    dsts = [dst[i * size : (i + 1) * size] for i in range(batch)]
    keys = [[f"{tag}-{j}-{i}" for i in range(batch)] for j in range(calls)]
    put: Callable[[list[str]], Any] = (
        (lambda ks: s.put_from(ks[0], srcs[0]))
        if batch == 1
        else (lambda ks: s.batch_put_from(ks, srcs))
    )
    get: Callable[[list[str]], Any] = (
        (lambda ks: s.get_into(ks[0], dsts[0]))
        if batch == 1
        else (lambda ks: s.batch_get_into(ks, dsts))
    )
    times: list[float] = []
    try:
        if op == "get":
            for ks in keys:
                put(ks)
            s.flush()
        fn = get if op == "get" else put
        m0, c0, w0 = _cpu_s(pool.master_pid), _own_cpu_s(), time.perf_counter()
        for ks in keys:
            t = time.perf_counter()
            fn(ks)
            times.append(time.perf_counter() - t)
        s.flush()
        wall = time.perf_counter() - w0
        m1, c1 = _cpu_s(pool.master_pid), _own_cpu_s()
        if op == "get" and bytes(dst) != bytes(src):
            raise SystemExit(f"{pool.name}: {row} read back other bytes")
        for ks in keys:
            for k in ks:
                s.remove(k, force=True)
    finally:
        s.unregister_buffer(src)
        s.unregister_buffer(dst)
    return times, wall, m1 - m0, c1 - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    wake = wakeup_cost()
    print(
        f"sendall to a sleeping reader: {wake['sleeps']:.1f} us p50; "
        f"to a polling one: {wake['polls']:.1f} us"
    )
    pools = {name: Pool(name, *setting) for name, setting in SETTINGS.items()}
    stats: dict[tuple[str, Row], dict[str, list[float]]] = {}
    try:
        for r in range(args.rounds):
            for row in ROWS:
                order = list(pools) if r % 2 == 0 else list(pools)[::-1]
                for name in order:
                    times, wall, mcpu, ccpu = _round(pools[name], row, args.calls, f"r{r}")
                    st = stats.setdefault((name, row), {"p50": [], "rate": [], "m": [], "c": []})
                    st["p50"].append(statistics.median(times) * 1e6)
                    st["rate"].append(args.calls / wall)
                    st["m"].append(mcpu)
                    st["c"].append(ccpu)
    finally:
        for p in pools.values():
            p.close()
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds x {args.calls} calls per row and setting; load {load:.1f}")
    head = "| mode | op | size | p50 us off / on | calls/s off / on | on ÷ off (thru / p50) |"
    print(head + " master CPU us/call off / on | client CPU us/call off / on |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for row in ROWS:
        off, on = stats[("off", row)], stats[("on", row)]
        med = {k: (statistics.median(off[k]), statistics.median(on[k])) for k in ("p50", "rate")}
        # CPU: clock ticks (10 ms) are coarse, so the sum over every round per call.
        calls = args.rounds * args.calls
        for k in ("m", "c"):
            med[k] = (sum(off[k]) / calls * 1e6, sum(on[k]) / calls * 1e6)
        label, op, size, batch = row
        what = f"{batch} x {size // KiB} KiB" if batch > 1 else f"{size // KiB} KiB"
        print(
            f"| {label} | {op} | {what} | {med['p50'][0]:.1f} / {med['p50'][1]:.1f} | "
            f"{med['rate'][0]:.0f} / {med['rate'][1]:.0f} | "
            f"{med['rate'][1] / med['rate'][0]:.2f} / {med['p50'][0] / med['p50'][1]:.2f} | "
            f"{med['m'][0]:.1f} / {med['m'][1]:.1f} | {med['c'][0]:.1f} / {med['c'][1]:.1f} |"
        )
        out.append({"mode": label, "op": op, "size": size, "batch": batch, **med})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"wakeup_us": wake, "rows": out, "load": load}, f, indent=1)


if __name__ == "__main__":
    main()
