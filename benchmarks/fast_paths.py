"""Large single puts and gets of the fast modes next to their physical limits, interleaved.

A narrower, faster A/B tool than `kvpool bench compare` for the issue-18 rows that compare a
kvpool path with a limit: `limit/memcpy` against `kvpool/shm+fast` (cached reads, nowait
writes) and, with `--tcp`, `limit/socket` against `kvpool/tcp+fast`. It uses the same drivers
as `kvpool bench compare` (`kvpool.bench.peers`), so the same pool, the same page-aligned
buffers and the same client calls; every api of each driver is measured (not only the fastest),
each round runs every (driver, op, api) once in turn, and every value read is compared with
what was put.

    .venv/bin/python benchmarks/fast_paths.py --sizes 1MiB,16MiB --rounds 7 [--tcp] [--strict]
    .venv/bin/python benchmarks/fast_paths.py --profile get_into --sizes 1MiB   # cProfile one
    .venv/bin/python benchmarks/fast_paths.py --zero-ab --rounds 10   # in-process A/B, below

`--zero-ab` runs every kvpool row twice per round, once with copies at distance 0 (both ends
page-aligned) taken as slow (the long chunk) and once as fast (`kvpool.transfer.copy.
zero_distance_slow`'s two answers), in alternating order, and labels the api `[0-slow]` /
`[0-fast]`: an A/B of that choice within one process, pool and Store. `--ab MODULE:NAME=A,B`
does the same for any module-level value (ints, or True/False), e.g.
`--ab kvpool.client.reader:_DIRECT_MAX=1048576,4194304`; rows are labelled `[NAME=A]`.

`--split` also times, inside the timed calls, the client's copy-and-hash
(`DataPath.copy_hashing`), its TCP transfers (`DataPath.transfer`, `DataPath.write_hashing`)
and its unwaited commit sends (`RpcClient.send`), and prints their mean µs per timed call next
to the call's own mean: where a put or get spends its time.

Reported per row: p50 of the call (median over rounds of each round's median) and the
throughput (median over rounds of calls / time), and the same-round ratio limit ÷ row by
throughput and by p50 (above 0.7 meets the issue's target). Asserts nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvpool.bench.peers.base import BenchError, Driver
from kvpool.bench.peers.kvpool_peer import KvpoolDriver
from kvpool.bench.peers.limits import MemcpyDriver, SocketDriver
from kvpool.bench.peers.workload import page_aligned
from kvpool.config import parse_size
from kvpool.transfer import copy as copy_mod

MiB = 1 << 20
_ROUND_BYTES = 128 * MiB
"""Bytes of values held at once: past the L3, so every get copies from memory."""


@dataclass
class Series:
    """The timings of one (driver, op, api), round by round."""

    p50: list[float] = field(default_factory=list)
    thru: list[float] = field(default_factory=list)


def _timed(n: int, fn: Callable[[int], object]) -> tuple[float, float]:
    """(p50 seconds per call, calls per second) of `n` calls of `fn(i)`."""
    times = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times), n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="1MiB,16MiB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--passes", type=int, default=3, help="Get passes over the keys per round.")
    ap.add_argument("--tcp", action="store_true", help="Also kvpool/tcp+fast and limit/socket.")
    ap.add_argument("--strict", action="store_true", help="Also the strict kvpool rows.")
    ap.add_argument("--shm", action="store_true", default=True)
    ap.add_argument("--profile", default="", help="cProfile this api (put, put_from, get...).")
    ap.add_argument("--json", default="")
    ap.add_argument("--zero-ab", action="store_true", help="A/B of the distance-0 choice.")
    ap.add_argument("--ab", default="", help="MODULE:NAME=A,B: an in-process A/B of a value.")
    ap.add_argument("--split", action="store_true", help="Time the parts of each call.")
    args = ap.parse_args()
    if args.split:
        _split_install()
    variants = _variants(args)
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    drivers: list[Driver] = [MemcpyDriver(), KvpoolDriver("shm", fast=True)]
    if args.strict:
        drivers.append(KvpoolDriver("shm"))
    if args.tcp:
        drivers += [SocketDriver(), KvpoolDriver("tcp", fast=True)]
        if args.strict:
            drivers.append(KvpoolDriver("tcp"))
    prof = cProfile.Profile() if args.profile else None
    results: dict[tuple[int, str, str, str], Series] = {}
    try:
        for d in drivers:
            d.setup(2 * _ROUND_BYTES)
        for size in sizes:
            keys = max(4, min(64, _ROUND_BYTES // size))
            values = [page_aligned(size) for _ in range(min(keys, 8))]
            rng = np.random.default_rng(size)
            for v in values:
                v[:] = rng.integers(0, 256, size, dtype=np.uint8)
            out = page_aligned(size)
            out.fill(0)
            for r in range(args.rounds):
                for d in drivers:
                    if not variants or not isinstance(d, KvpoolDriver):
                        _round(
                            d, size, keys, values, out, r, args.passes, results, prof, args.profile
                        )
                        continue
                    module, name = variants[0][0], variants[0][1]
                    saved = getattr(module, name)
                    try:
                        for _m, _n, value, tag in variants if r % 2 else variants[::-1]:
                            setattr(module, name, value)
                            _round(
                                d, size, keys, values, out, r, args.passes, results, None, "", tag
                            )
                    finally:
                        setattr(module, name, saved)
    finally:
        for d in drivers:
            d.teardown()
    _report(results, sizes, args.json)
    if args.split:
        _split_report(results)
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


_PARTS: dict[tuple[int, str, str, str], dict[str, float]] = {}
"""Seconds spent in each timed part (`--split`), per row."""
_current: list[tuple[int, str, str, str] | None] = [None]


def _split_install() -> None:
    """Wrap the parts `--split` times (in this process: the client)."""
    from kvpool.client.datapath import DataPath
    from kvpool.rpc.client import RpcClient

    def wrap(cls: Any, name: str) -> None:
        inner = getattr(cls, name)

        def timed(*a: Any, **k: Any) -> Any:
            row = _current[0]
            if row is None:
                return inner(*a, **k)
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                parts = _PARTS.setdefault(row, {})
                parts[name] = parts.get(name, 0.0) + time.perf_counter() - t

        setattr(cls, name, timed)

    for name in ("copy_hashing", "transfer", "write_hashing"):
        wrap(DataPath, name)
    wrap(RpcClient, "send")


def _split_report(results: dict[tuple[int, str, str, str], Series]) -> None:
    print("\nmean µs per timed call: the call, and the parts timed inside it (--split)")
    for row, parts in sorted(_PARTS.items()):
        calls = _CALLS.get(row, 0)
        if not calls or row not in results:
            continue
        whole = _WHOLE.get(row, 0.0)
        cells = ", ".join(f"{k} {v / calls * 1e6:.1f}" for k, v in sorted(parts.items()))
        size, path, op, api = row
        print(f"{size >> 20:>4}Mi {op:4} {path:10} {api:13} {whole / calls * 1e6:8.1f}: {cells}")


_CALLS: dict[tuple[int, str, str, str], int] = {}
_WHOLE: dict[tuple[int, str, str, str], float] = {}


def _variants(args: argparse.Namespace) -> list[tuple[Any, str, object, str]]:
    """(module, name, value, row label) of each side of the A/B asked for (none: [])."""
    if args.zero_ab:
        return [
            (copy_mod, "_zero_slow", True, " [0-slow]"),
            (copy_mod, "_zero_slow", False, " [0-fast]"),
        ]
    if not args.ab:
        return []
    where, _, values = args.ab.partition("=")
    mod_name, _, name = where.partition(":")
    module = importlib.import_module(mod_name)
    getattr(module, name)  # it must exist
    out: list[tuple[Any, str, object, str]] = []
    for text in values.split(","):
        value: object = {"True": True, "False": False}.get(text)
        if value is None:
            value = int(text)
        out.append((module, name, value, f" [{name}={text}]"))
    return out


def _round(
    d: Driver,
    size: int,
    keys: int,
    values: list[np.ndarray],  # type: ignore[type-arg]
    out: np.ndarray,  # type: ignore[type-arg]
    r: int,
    passes: int,
    results: dict[tuple[int, str, str, str], Series],
    prof: cProfile.Profile | None,
    profiled: str,
    tag: str = "",
) -> None:
    views = [memoryview(v) for v in values]
    out_mv = memoryview(out)
    for v in views:
        d.register(v)
    d.register(out_mv)
    try:
        for api in d.apis("put", False):
            d.reset()
            d.use_api("put", False, api)
            names = [f"k{r}.{api}.{i}" for i in range(keys)]

            def put(i: int, names: list[str] = names) -> None:
                d.put(names[i], views[i % len(views)])

            _run(d, size, "put", api + tag, keys, put, results, prof if api == profiled else None)
        for api in d.apis("get", False):
            d.use_api("get", False, api)
            got = d.get(names[0], out_mv)
            if bytes(got) != bytes(views[0]):
                raise BenchError(f"{d.label} {api}: wrong bytes")

            def get(i: int, names: list[str] = names) -> None:
                d.get(names[i % keys], out_mv)

            _run(
                d,
                size,
                "get",
                api + tag,
                keys * passes,
                get,
                results,
                prof if api == profiled else None,
            )
            got = d.get(names[keys - 1], out_mv)
            if bytes(got) != bytes(views[(keys - 1) % len(views)]):
                raise BenchError(f"{d.label} {api}: wrong bytes")
        d.reset()
    finally:
        for v in views:
            d.unregister(v)
        d.unregister(out_mv)


def _run(
    d: Driver,
    size: int,
    op: str,
    api: str,
    n: int,
    fn: Callable[[int], object],
    results: dict[tuple[int, str, str, str], Series],
    prof: cProfile.Profile | None,
) -> None:
    row = (size, d.path, op, api)
    if prof is not None:
        prof.enable()
    _current[0] = row
    t0 = time.perf_counter()
    try:
        p50, thru = _timed(n, fn)
    finally:
        _current[0] = None
        _WHOLE[row] = _WHOLE.get(row, 0.0) + time.perf_counter() - t0
        _CALLS[row] = _CALLS.get(row, 0) + n
        if prof is not None:
            prof.disable()
    s = results.setdefault(row, Series())
    s.p50.append(p50)
    s.thru.append(thru)


def _report(
    results: dict[tuple[int, str, str, str], Series], sizes: list[int], json_path: str
) -> None:
    rows = []
    print(f"{'size':>6} {'op':4} {'path':10} {'api':13} {'p50 us':>8} {'ops/s':>8}  ratio thru/p50")
    for size in sizes:
        for op in ("put", "get"):
            for (sz, path, o, api), s in results.items():
                if sz != size or o != op:
                    continue
                limit_path = "socket" if path.startswith("tcp") else "memcpy"
                base = next(
                    (
                        v
                        for (z, p, oo, _), v in results.items()
                        if (z, p, oo) == (sz, limit_path, o)
                    ),
                    None,
                )
                ratio = ""
                row = {
                    "size": size,
                    "op": op,
                    "path": path,
                    "api": api,
                    "p50_us": statistics.median(s.p50) * 1e6,
                    "ops_per_s": statistics.median(s.thru),
                }
                if base is not None and base is not s:
                    rt = statistics.median([a / b for a, b in zip(s.thru, base.thru, strict=True)])
                    rp = statistics.median([b / a for a, b in zip(s.p50, base.p50, strict=True)])
                    ratio = f"{rt:.2f} / {rp:.2f}"
                    row |= {"ratio_thru": rt, "ratio_p50": rp}
                rows.append(row)
                print(
                    f"{size >> 20:>4}Mi {op:4} {path:10} {api:13} {row['p50_us']:8.1f} "
                    f"{row['ops_per_s']:8.0f}  {ratio}"
                )
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
