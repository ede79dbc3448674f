"""Measure etcd clients on this machine: the numbers behind kvpool.ha's choice (docs/parts/ha.md).

    PYTHONPATH=tests .venv/bin/python tests/ha/measure_clients.py [--n 2000]

Starts a private etcd (tests/kvtest/etcd.py), then for kvpool.ha.gateway.EtcdGateway (standard
library, JSON gateway) and, when installed (`pip install aetcd`), aetcd (asyncio, gRPC):
lock-step put and get latency (64-byte values over 100 keys), puts/s with many requests in
flight, lease keepalive latency, and watch delivery latency (a put until its event arrives).
Also each client's import time and what it installs. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.ha import EtcdGateway
from kvtest.etcd import EtcdServer

VALUE = b"x" * 64


def pct(samples: list[float]) -> str:
    xs = sorted(samples)
    p50 = xs[len(xs) // 2] * 1e6
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e6
    return f"p50 {p50:6.0f} us  p99 {p99:6.0f} us"


def lockstep(name: str, n: int, call: Callable[[int], Any]) -> None:
    for i in range(100):
        call(i)
    times = []
    t0 = time.perf_counter()
    for i in range(n):
        a = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - a)
    rate = n / (time.perf_counter() - t0)
    print(f"  {name:28s} {rate:7.0f} ops/s  {pct(times)}")


def import_ms(module: str) -> float:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import time; t = time.perf_counter(); import {module}; "
            "print((time.perf_counter() - t) * 1e3)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


def installed(dists: list[str]) -> str:
    total = 0
    names = []
    for d in dists:
        try:
            dist = importlib.metadata.distribution(d)
        except importlib.metadata.PackageNotFoundError:
            continue
        names.append(f"{d} {dist.version}")
        for f in dist.files or ():
            p = Path(str(dist.locate_file(f)))
            if p.is_file():
                total += p.stat().st_size
    return f"{', '.join(names)}: {total / 1e6:.1f} MB"


def measure_gateway(endpoint: str, n: int) -> None:
    print(
        "EtcdGateway (stdlib http.client, JSON gateway); import of what it needs "
        f"(http.client, json, base64) {import_ms('http.client, json, base64'):.0f} ms, "
        "installs nothing"
    )
    gw = EtcdGateway([endpoint])
    lockstep("put lock-step", n, lambda i: gw.put(b"k%d" % (i % 100), VALUE))
    lockstep("get lock-step", n, lambda i: gw.get(b"k%d" % (i % 100)))
    lease = gw.grant(60)
    lockstep("keepalive lock-step", n // 4, lambda i: gw.keepalive(lease.id))
    for threads in (16, 64):
        per = 4000 // threads

        def work(t: int, per: int = per) -> None:
            for i in range(per):
                gw.put(b"c%d-%d" % (t, i), VALUE)

        ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        t0 = time.perf_counter()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        print(
            f"  put, {threads} threads             {per * threads / (time.perf_counter() - t0):7.0f} ops/s"
        )
    watch = gw.watch(b"w")
    delays = []
    for i in range(n // 10):
        a = time.perf_counter()
        gw.put(b"w", b"%d" % i)
        while not watch.get(5):
            pass
        delays.append(time.perf_counter() - a)
    watch.close()
    print(f"  {'watch: put -> event':28s} {'':7s}        {pct(delays)}")
    gw.revoke(lease.id)
    gw.close()


def measure_aetcd(endpoint: str, n: int) -> None:
    try:
        import aetcd  # type: ignore[import-not-found]
    except ImportError:
        print("aetcd: not installed (pip install aetcd) -- skipped")
        return
    print(
        f"aetcd (asyncio, gRPC); import {import_ms('aetcd'):.0f} ms, installs "
        f"{installed(['aetcd', 'grpcio', 'protobuf'])}"
    )
    host, port = endpoint.rsplit(":", 1)

    async def main() -> None:
        c = aetcd.Client(host=host, port=int(port))

        async def timed(name: str, count: int, call: Callable[[int], Any]) -> None:
            for i in range(100):
                await call(i)
            times = []
            t0 = time.perf_counter()
            for i in range(count):
                a = time.perf_counter()
                await call(i)
                times.append(time.perf_counter() - a)
            print(f"  {name:28s} {count / (time.perf_counter() - t0):7.0f} ops/s  {pct(times)}")

        await timed("put lock-step", n, lambda i: c.put(b"k%d" % (i % 100), VALUE))
        await timed("get lock-step", n, lambda i: c.get(b"k%d" % (i % 100)))
        for flight in (16, 64, 256):
            sem = asyncio.Semaphore(flight)

            async def one(i: int, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    await c.put(b"c%d" % i, VALUE)

            t0 = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(4000)))
            print(
                f"  put, {flight} in flight           {4000 / (time.perf_counter() - t0):7.0f} ops/s"
            )
        watch = await c.watch(b"aw")
        events = watch.__aiter__()
        delays = []
        for i in range(n // 10):
            a = time.perf_counter()
            await c.put(b"aw", b"%d" % i)
            await asyncio.wait_for(events.__anext__(), 5)
            delays.append(time.perf_counter() - a)
        await watch.cancel()
        print(f"  {'watch: put -> event':28s} {'':7s}        {pct(delays)}")
        await c.close()

    asyncio.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="lock-step operations per case")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpool-etcd-measure-") as tmp:
        server = EtcdServer(Path(tmp) / "data")
        try:
            server.start()
            print(f"etcd {server.endpoint}; {args.n} lock-step ops per case; median of samples")
            measure_gateway(server.endpoint, args.n)
            measure_aetcd(server.endpoint, args.n)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
