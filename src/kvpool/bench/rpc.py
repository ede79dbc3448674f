"""Round-trip benchmarks of the RPC layer, generic over the service's messages.

A service can measure its calls through the same cases, so its numbers compare directly with
the bare RPC floor (an echo through this layer, tests/bench/bench_rpc.py). The caller brings the
messages and a check of every reply:

    spec = BenchSpec(endpoint, response_type=Response, make_request=lambda i: Echo(payload),
                     check=lambda i, reply: ..., cluster_id=...)
    rows = run_cases(spec)

Cases (each a `kvpool.bench.rows` row, ``op`` and ``value_size`` from the caller):

* ``sync-lockstep``: one thread, one `RpcClient.call` after the other (batch 1);
* ``sync-pipelined``: one thread, `RpcClient.call_many` of one window at a time (batch = window);
* ``sync-stream``: one `RpcClient.call_many` over all ``n`` requests, ``window`` in flight;
* ``sync-threads``: `threads` threads sharing one `RpcClient` (pipelined across threads);
* ``async-lockstep``, ``async-pipelined`` (`AsyncRpcClient.call_many`), ``async-gather``
  (`window` concurrent `call`s gathered).

`lockstep_by_transport` measures sync lock-step over TCP and over the server's Unix socket in
one run, interleaved (rows ``lockstep-tcp`` and ``lockstep-unix``, ``path`` the transport used).

Latency percentiles are per call for lock-step and threads cases, and per window for pipelined
ones. Every reply is passed to ``check`` so a benchmark that measures wrong answers fails.
Numbers on a shared machine are noisy: compare rows of one run, never absolute values.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvpool.bench.rows import Column, Row, median_row, percentile, render_table
from kvpool.errors import InvalidParams
from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.client import RpcClient
from kvpool.rpc.loop import new_event_loop

__all__ = [
    "CASES",
    "TRANSPORT_CASES",
    "BenchSpec",
    "format_table",
    "lockstep_by_transport",
    "median_rows",
    "row",
    "run_cases",
]

CASES = (
    "sync-lockstep",
    "sync-pipelined",
    "sync-stream",
    "sync-threads",
    "async-lockstep",
    "async-pipelined",
    "async-gather",
)
#: The rows of `lockstep_by_transport`, in order.
TRANSPORT_CASES = ("lockstep-tcp", "lockstep-unix")


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """What to measure. ``make_request(i)`` builds the i-th request; ``check(i, reply)``
    raises when the reply is wrong."""

    endpoint: str
    response_type: Any
    make_request: Callable[[int], Any]
    check: Callable[[int, Any], None]
    cluster_id: str = "kvpool"
    op: str = "echo"
    value_size: int = 0
    #: Calls per case.
    n: int = 20_000
    window: int = 64
    threads: int = 4
    system: str = "kvpool"
    path: str = "tcp"
    #: Whether the clients of the cases may move to the server's Unix socket (same host);
    #: False keeps them on TCP. Set `path` to match.
    unix: bool = False
    #: Builds the sync client for the sync cases (default: an `RpcClient`); lets a variant
    #: client with the same ``connect/call/call_many/close`` be measured in the same run.
    client_factory: Callable[[BenchSpec], Any] | None = None

    def __post_init__(self) -> None:
        for name in ("n", "window", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidParams(f"{name}: {value!r} must be a positive integer")


def row(
    spec: BenchSpec,
    case: str,
    *,
    calls: int,
    seconds: float,
    latencies_s: list[float],
    batch: int,
) -> dict[str, Any]:
    """One result row (`kvpool.bench.rows`, plus ``case``) in its JSON form."""
    ops = calls / seconds if seconds > 0 else 0.0
    return Row(
        system=spec.system,
        path=spec.path,
        op=spec.op,
        value_size=spec.value_size,
        batch=batch,
        ops_per_s=ops,
        bytes_per_s=ops * spec.value_size,
        p50_us=percentile(latencies_s, 0.5) * 1e6,
        p99_us=percentile(latencies_s, 0.99) * 1e6,
        calls=calls,
        extra={"case": case},
    ).to_json()


def _client(spec: BenchSpec) -> Any:
    if spec.client_factory is not None:
        return spec.client_factory(spec)
    return RpcClient(
        spec.endpoint,
        response_type=spec.response_type,
        cluster_id=spec.cluster_id,
        client_name="bench",
        timeout=60,
        unix=spec.unix,
    )


def _sync_lockstep(spec: BenchSpec) -> dict[str, Any]:
    reqs = [spec.make_request(i) for i in range(spec.n)]
    lat: list[float] = []
    with _client(spec) as c:
        c.connect()
        call = c.call
        clock = time.perf_counter
        t0 = clock()
        for i, req in enumerate(reqs):
            t = clock()
            reply = call(req)
            lat.append(clock() - t)
            spec.check(i, reply)
        elapsed = clock() - t0
    return row(spec, "sync-lockstep", calls=spec.n, seconds=elapsed, latencies_s=lat, batch=1)


def _sync_pipelined(spec: BenchSpec) -> dict[str, Any]:
    reqs = [spec.make_request(i) for i in range(spec.n)]
    lat: list[float] = []
    w = spec.window
    with _client(spec) as c:
        c.connect()
        clock = time.perf_counter
        t0 = clock()
        for start in range(0, spec.n, w):
            t = clock()
            replies = c.call_many(reqs[start : start + w], window=w)
            lat.append(clock() - t)
            for j, reply in enumerate(replies):
                spec.check(start + j, reply)
        elapsed = clock() - t0
    return row(spec, "sync-pipelined", calls=spec.n, seconds=elapsed, latencies_s=lat, batch=w)


def _sync_stream(spec: BenchSpec) -> dict[str, Any]:
    reqs = [spec.make_request(i) for i in range(spec.n)]
    with _client(spec) as c:
        c.connect()
        t0 = time.perf_counter()
        replies = c.call_many(reqs, window=spec.window)
        elapsed = time.perf_counter() - t0
    for i, reply in enumerate(replies):
        spec.check(i, reply)
    # No per-call latency exists here: p50/p99 report the mean time per call.
    mean = elapsed / spec.n
    return row(
        spec, "sync-stream", calls=spec.n, seconds=elapsed, latencies_s=[mean], batch=spec.window
    )


def _sync_threads(spec: BenchSpec) -> dict[str, Any]:
    per = max(1, spec.n // spec.threads)
    lats: list[list[float]] = [[] for _ in range(spec.threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(spec.threads + 1)
    with _client(spec) as c:
        c.connect()

        def work(k: int) -> None:
            reqs = [(k * per + i, spec.make_request(k * per + i)) for i in range(per)]
            lat = lats[k]
            clock = time.perf_counter
            start.wait()
            try:
                for i, req in reqs:
                    t = clock()
                    reply = c.call(req)
                    lat.append(clock() - t)
                    spec.check(i, reply)
            except BaseException as exc:
                errors.append(exc)

        workers = [
            threading.Thread(target=work, args=(k,), name=f"bench-{k}") for k in range(spec.threads)
        ]
        for t in workers:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    all_lat = [x for lat in lats for x in lat]
    return row(
        spec,
        "sync-threads",
        calls=per * spec.threads,
        seconds=elapsed,
        latencies_s=all_lat,
        batch=1,
    )


async def _async_cases(spec: BenchSpec, cases: Sequence[str]) -> list[dict[str, Any]]:
    reqs = [spec.make_request(i) for i in range(spec.n)]
    out: list[dict[str, Any]] = []
    w = spec.window
    clock = time.perf_counter
    async with AsyncRpcClient(
        spec.endpoint,
        response_type=spec.response_type,
        cluster_id=spec.cluster_id,
        client_name="bench-async",
        timeout=60,
        unix=spec.unix,
    ) as c:
        await c.connect()
        if "async-lockstep" in cases:
            lat: list[float] = []
            t0 = clock()
            for i, req in enumerate(reqs):
                t = clock()
                reply = await c.call(req)
                lat.append(clock() - t)
                spec.check(i, reply)
            out.append(
                row(
                    spec,
                    "async-lockstep",
                    calls=spec.n,
                    seconds=clock() - t0,
                    latencies_s=lat,
                    batch=1,
                )
            )

        async def windowed(case: str, send: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
            """One window of `w` requests at a time through `send`, each window one latency."""
            lat: list[float] = []
            t0 = clock()
            for start in range(0, spec.n, w):
                t = clock()
                replies = await send(reqs[start : start + w])
                lat.append(clock() - t)
                for j, reply in enumerate(replies):
                    spec.check(start + j, reply)
            out.append(
                row(spec, case, calls=spec.n, seconds=clock() - t0, latencies_s=lat, batch=w)
            )

        async def gather(window: list[Any]) -> list[Any]:
            return list(await asyncio.gather(*(c.call(r) for r in window)))

        if "async-pipelined" in cases:
            await windowed("async-pipelined", lambda window: c.call_many(window, window=w))
        if "async-gather" in cases:
            await windowed("async-gather", gather)
    return out


def lockstep_by_transport(spec: BenchSpec, *, rounds: int = 10) -> list[dict[str, Any]]:
    """Sync lock-step over TCP and over the server's Unix socket, interleaved in one run.

    Two `RpcClient`s stay connected, one with ``unix=False``; each makes ``spec.n`` calls, in
    `rounds` alternating slices (which one goes first alternates too), so that the load of a
    shared machine falls on both alike. Rows `TRANSPORT_CASES`, each with ``path`` the
    transport its client actually used: a server without a Unix socket (or
    ``KVPOOL_RPC_UNIX=0``) gives two TCP rows, never a mislabelled one.
    """
    if not isinstance(rounds, int) or rounds < 1:
        raise InvalidParams(f"rounds: {rounds!r} must be a positive integer")
    reqs = [spec.make_request(i) for i in range(spec.n)]
    kinds = ("tcp", "unix")
    clients = {
        kind: RpcClient(
            spec.endpoint,
            response_type=spec.response_type,
            cluster_id=spec.cluster_id,
            client_name=f"bench-{kind}",
            timeout=60,
            unix=kind == "unix",
        )
        for kind in kinds
    }
    lat: dict[str, list[float]] = {kind: [] for kind in kinds}
    elapsed = dict.fromkeys(kinds, 0.0)
    paths: dict[str, str] = {}
    clock = time.perf_counter
    try:
        for kind, c in clients.items():
            c.connect()
            paths[kind] = c.transport or "tcp"
        per = -(-spec.n // rounds)
        for k, start in enumerate(range(0, spec.n, per)):
            for kind in kinds if k % 2 == 0 else kinds[::-1]:
                call = clients[kind].call
                out = lat[kind]
                t0 = clock()
                for i in range(start, min(spec.n, start + per)):
                    t = clock()
                    reply = call(reqs[i])
                    out.append(clock() - t)
                    spec.check(i, reply)
                elapsed[kind] += clock() - t0
    finally:
        for c in clients.values():
            c.close()
    return [
        row(
            replace(spec, path=paths[kind]),
            case,
            calls=spec.n,
            seconds=elapsed[kind],
            latencies_s=lat[kind],
            batch=1,
        )
        for kind, case in zip(kinds, TRANSPORT_CASES, strict=True)
    ]


def run_cases(spec: BenchSpec, cases: Sequence[str] = CASES) -> list[dict[str, Any]]:
    """Run `cases` (names from `CASES`) against the server at ``spec.endpoint``; rows in order.

    Sync cases run in the calling thread (and `threads` helpers); async cases on a fresh loop
    from `new_event_loop`, so call this from synchronous code.
    """
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise InvalidParams(f"cases: unknown {unknown}; choose from {list(CASES)}")
    rows: list[dict[str, Any]] = []
    sync = {
        "sync-lockstep": _sync_lockstep,
        "sync-pipelined": _sync_pipelined,
        "sync-stream": _sync_stream,
        "sync-threads": _sync_threads,
    }
    for case in cases:
        if case in sync:
            rows.append(sync[case](spec))
    async_cases = [c for c in cases if c.startswith("async-")]
    if async_cases:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            rows.extend(runner.run(_async_cases(spec, async_cases)))
    order = {c: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order.get(str(r.get("case")), len(order)))
    return rows


_COLUMNS = (
    Column("system", "<10", lambda r: r["system"]),
    Column("op", "<16", lambda r: r["op"]),
    Column("case", "<22", lambda r: r.get("case", "")),
    Column("path", "<5", lambda r: r["path"]),
    Column("batch", ">5", lambda r: str(r["batch"])),
    Column("ops/s", ">10", lambda r: f"{r['ops_per_s']:.0f}"),
    Column("p50 us", ">9", lambda r: f"{r['p50_us']:.1f}"),
    Column("p99 us", ">9", lambda r: f"{r['p99_us']:.1f}"),
)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of rows (case, path, batch, ops/s, p50, p99)."""
    return render_table(_COLUMNS, rows)


def median_rows(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per case, the row whose ops_per_s is the median over repeated runs (same case order)."""
    return [
        {**median_row(group, lambda r: r["ops_per_s"]), "repeats": len(group)}
        for group in zip(*runs, strict=True)
    ]
