"""`kvpool bench master`: control-plane throughput of the master, and its memory per object.

Setup: a `kvpool master` child process on a loopback port and this process as its one client
(`RpcClient`). A node's segment is mounted by a fake node client (the master never touches
segment memory, so no memory is created). Cases, each against a baseline measured in the same
run, interleaved over `repeats` rounds and reported as the median round:

* `echo` lock-step and pipelined (window 64): the RPC floor through the same layer;
* `get_replica_list` lock-step (ratio against the lock-step echo: how much the master's own
  work adds to a round trip) and pipelined;
* `put` = PutStart + PutEnd (two round trips per key), lock-step and pipelined;
* `batch_get_replica_list` and `batch_put` (BatchPutStart + BatchPutEnd) of 64 keys per
  request, lock-step and pipelined (4 requests in flight): keys/s;
* `commit` and `batch_commit`: the one-round-trip put (PutCommit / BatchPutCommit into arenas
  reserved before the clock starts), and `batch_get_locations`, the compact batch read the
  Store uses.

The client reaches the master as a Store on its host does: over the master's Unix socket
(the rows' `path` says which transport was used).

For every case the master's CPU time (user + system, read from /proc through psutil) is divided
by the keys served: `master_cpu_us_per_key`, the cost that bounds throughput once the client
side is not the bottleneck.

Memory (`"metric": "master_bytes_per_object"`): a fresh master, one segment, then N objects
(one memory replica, 31-byte keys, a 64-bit checksum each) put in batches; the growth of the
master's RSS divided by N (N = 1,000,000 in the full run). Measured twice: without reclaim hooks
(the master's own metadata) and with them (what `kvpool master` runs by default).

`--lockstep-rounds N` measures only lock-step GetReplicaList against lock-step Echo, in N
interleaved rounds of 3,000 of each on one master (`"metric": "lockstep_get_vs_echo"`, the
median of the per-round ratios): the form of the lock-step target that load swings disturb
least.

Every reply is checked (codes, and the replica offsets read back against those PutStart gave);
the benchmark never asserts a speed.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click
import psutil

from kvpool.bench.rows import Column, Row, median_row, percentile, render_table, write_json
from kvpool.children import Child
from kvpool.errors import KVPoolError
from kvpool.protocol import messages as m
from kvpool.rpc.client import RpcClient

__all__ = ["Plan", "command", "measure_lockstep_ratio", "measure_memory", "run"]

NODE = m.ClientId("bench-node")
WRITER = m.ClientId("bench-writer")
HOST = m.HostId("bench-host")
SEGMENT = m.SegmentName("bench-segment")
SEGMENT_SIZE = 1 << 44  # metadata only: the master never maps it
OBJECT_SIZE = 4096
BATCH = 64
WINDOW = 64
BATCH_WINDOW = 4


@dataclass(frozen=True, slots=True)
class Plan:
    """How much each case does."""

    single_ops: int
    """Keys per single-key case and round."""
    batch_reqs: int
    """Batch requests per batch case and round."""
    repeats: int
    memory_objects: int

    @staticmethod
    def of(quick: bool) -> Plan:
        if quick:
            return Plan(single_ops=300, batch_reqs=20, repeats=1, memory_objects=20_000)
        return Plan(single_ops=10_000, batch_reqs=600, repeats=3, memory_objects=1_000_000)


class _Master:
    """A `kvpool master` child plus a client of it; `close()` stops both (idempotent)."""

    def __init__(
        self,
        reclaim: bool,
        data_dir: str | None = None,
        extra: Sequence[str] = (),
        port: int = 0,
        ready: Callable[[Child], str] | None = None,
    ) -> None:
        # A long client TTL: the benchmark's fake node does not ping while it measures.
        args = ["master", "--host", "127.0.0.1", "--port", str(port), "--client-ttl", "1h"]
        args.append("--reclaim" if reclaim else "--no-reclaim")
        if data_dir is not None:
            args += ["--data-dir", data_dir]
        args += extra
        self.proc = Child([sys.executable, "-m", "kvpool", *args], name="kvpool master (bench)")
        try:
            self.address = self.proc.wait_ready(60) if ready is None else ready(self.proc)
            self.rpc = RpcClient(
                self.address, response_type=m.Response, timeout=120, client_name="bench"
            )
            self.ps = psutil.Process(self.proc.pid)
            info = m.SegmentInfo(SEGMENT, SEGMENT_SIZE, HOST, "127.0.0.1:1", "")
            reply = self.rpc.call(m.MountSegment(NODE, HOST, info))
            _expect(reply.code == 0, f"mount failed: {reply}")
        except BaseException:
            self.proc.stop(grace=10.0)
            raise

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def close(self) -> None:
        self.rpc.close()
        self.proc.stop(grace=10.0)


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise KVPoolError(f"benchmark check failed: {what}")


def _keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:024x}"[-31:] for i in range(n)]


# ---------------------------------------------------------------- cases
#
# Each case is a function (rpc, round) -> (keys served, seconds, latencies of its calls); the
# caller adds the master CPU and turns it into a row.

Case = Callable[[RpcClient, int], tuple[int, float, list[float]]]


def _lockstep(requests: Sequence[Any], check: Callable[[int, Any], None]) -> Case:
    def run(rpc: RpcClient, _round: int) -> tuple[int, float, list[float]]:
        call, clock = rpc.call, time.perf_counter
        lat: list[float] = []
        t0 = clock()
        for i, req in enumerate(requests):
            t = clock()
            reply = call(req)
            lat.append(clock() - t)
            check(i, reply)
        return len(requests), clock() - t0, lat

    return run


def _pipelined(requests: Sequence[Any], check: Callable[[int, Any], None], window: int) -> Case:
    def run(rpc: RpcClient, _round: int) -> tuple[int, float, list[float]]:
        clock = time.perf_counter
        lat: list[float] = []
        t0 = clock()
        for start in range(0, len(requests), window):
            t = clock()
            replies = rpc.call_many(requests[start : start + window], window=window)
            lat.append(clock() - t)
            for j, reply in enumerate(replies):
                check(start + j, reply)
        return len(requests), clock() - t0, lat

    return run


def _put_case(plan: Plan, pipelined: bool, batch: int) -> Case:
    """PutStart + PutEnd of fresh keys (each round its own keys), per key or per batch."""

    def run(rpc: RpcClient, rnd: int) -> tuple[int, float, list[float]]:
        n = plan.batch_reqs * batch if batch > 1 else plan.single_ops
        keys = _keys(f"p{int(pipelined)}b{batch}r{rnd}", n)
        sums = [i * 2654435761 % (1 << 64) for i in range(n)]
        if batch == 1:
            starts: list[Any] = [m.PutStart(WRITER, k, OBJECT_SIZE) for k in keys]
            ends: list[Any] = [m.PutEnd(WRITER, k, s) for k, s in zip(keys, sums, strict=True)]
        else:
            starts = [
                m.BatchPutStart(WRITER, keys[i : i + batch], [OBJECT_SIZE] * batch)
                for i in range(0, n, batch)
            ]
            ends = [
                m.BatchPutEnd(WRITER, keys[i : i + batch], sums[i : i + batch])
                for i in range(0, n, batch)
            ]
        window = (BATCH_WINDOW if batch > 1 else WINDOW) if pipelined else 1
        clock = time.perf_counter
        lat: list[float] = []
        t0 = clock()
        for i in range(0, len(starts), window):
            t = clock()
            if window == 1:
                r1 = [rpc.call(starts[i])]
                r2 = [rpc.call(ends[i])]
            else:
                r1 = rpc.call_many(starts[i : i + window], window=window)
                r2 = rpc.call_many(ends[i : i + window], window=window)
            lat.append(clock() - t)
            for a, b in zip(r1, r2, strict=True):
                if batch == 1:
                    _expect(a.code == 0 and len(a.replicas) == 1 and b.code == 0, f"put {a} {b}")
                else:
                    _expect(all(r.code == 0 for r in a.results), "batch put start")
                    _expect(b.codes == [0] * batch, "batch put end")
        return n, clock() - t0, lat

    return run


def _commit_case(plan: Plan, pipelined: bool, batch: int) -> Case:
    """PutCommit (one round trip per put, `kvpool.master.arenas`) of fresh keys, per key or per
    batch, into arenas reserved before the clock starts (one ReserveArena per 64 MiB of values:
    16,384 puts of 4 KiB) and released after it stops."""
    arena_bytes = 64 << 20
    per_arena = arena_bytes // OBJECT_SIZE

    def run(rpc: RpcClient, rnd: int) -> tuple[int, float, list[float]]:
        n = plan.batch_reqs * batch if batch > 1 else plan.single_ops
        keys = _keys(f"xb{batch}r{rnd}c{int(pipelined)}", n)  # [-31:] keeps the "c" part
        sums = [i * 2654435761 % (1 << 64) for i in range(n)]
        arenas: list[m.ArenaReply] = []
        for _ in range((n + per_arena - 1) // per_arena):
            a = rpc.call(m.ReserveArena(WRITER, arena_bytes, arena_bytes))
            _expect(isinstance(a, m.ArenaReply) and a.code == 0, f"ReserveArena: {a}")
            arenas.append(a)
        place = [
            (
                arenas[i // per_arena].arena_id,
                arenas[i // per_arena].offset + (i % per_arena) * OBJECT_SIZE,
            )
            for i in range(n)
        ]
        reqs: list[Any]
        if batch == 1:
            reqs = [
                m.PutCommit(WRITER, k, OBJECT_SIZE, place[i][0], place[i][1], sums[i])
                for i, k in enumerate(keys)
            ]
        else:
            reqs = [
                m.BatchPutCommit(
                    WRITER,
                    place[i][0],
                    keys[i : i + batch],
                    [OBJECT_SIZE] * batch,
                    [place[j][1] for j in range(i, i + batch)],
                    sums[i : i + batch],
                )
                for i in range(0, n, batch)
            ]
        window = (BATCH_WINDOW if batch > 1 else WINDOW) if pipelined else 1
        clock = time.perf_counter
        lat: list[float] = []
        t0 = clock()
        for i in range(0, len(reqs), window):
            t = clock()
            got = [rpc.call(reqs[i])] if window == 1 else rpc.call_many(reqs[i : i + window])
            lat.append(clock() - t)
            for r in got:
                ok = r.code == 0 if batch == 1 else r.codes == [0] * batch
                _expect(ok, f"commit {r}")
        elapsed = clock() - t0
        rpc.call(m.ReleaseArenas(WRITER, [a.arena_id for a in arenas]))
        return n, elapsed, lat

    return run


@dataclass(slots=True)
class _Measured:
    op: str
    case: str
    batch: int
    keys: int
    seconds: float
    latencies: list[float]
    master_cpu_s: float
    calls_per_key: float
    transport: str = "tcp"


def _row(x: _Measured, repeats: int, reclaim: bool) -> dict[str, Any]:
    keys_per_s = x.keys / x.seconds if x.seconds > 0 else 0.0
    return Row(
        system="kvpool",
        path=x.transport,
        op=x.op,
        value_size=0,
        batch=x.batch,
        ops_per_s=keys_per_s / x.batch,
        bytes_per_s=0.0,
        p50_us=percentile(x.latencies, 0.5) * 1e6,
        p99_us=percentile(x.latencies, 0.99) * 1e6,
        calls=len(x.latencies),
        extra={
            "case": x.case,
            "keys_per_s": keys_per_s,
            "master_cpu_us_per_key": x.master_cpu_s / x.keys * 1e6 if x.keys else 0.0,
            "round_trips_per_op": x.calls_per_key * x.batch,
            "repeats": repeats,
            "reclaim": reclaim,
        },
    ).to_json()


def run(
    plan: Plan,
    reclaim: bool = True,
    log: Callable[[str], None] = lambda s: None,
    data_dir: str | None = None,
    master_args: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """All throughput rows (against a master with or without reclaim hooks, with its
    operation log in `data_dir` if given, started with `master_args` more), then the memory
    rows (both ways)."""
    master = _Master(reclaim, data_dir, extra=master_args)
    try:
        rpc = master.rpc
        # Objects to read: put once, remembered offsets checked on every read.
        n_read = max(plan.single_ops, BATCH * plan.batch_reqs)
        read_keys = _keys("read", n_read)
        offsets: dict[str, int] = {}
        for i in range(0, n_read, 1000):
            chunk = read_keys[i : i + 1000]
            started = rpc.call(m.BatchPutStart(WRITER, chunk, [OBJECT_SIZE] * len(chunk)))
            for k, r in zip(chunk, started.results, strict=True):
                _expect(r.code == 0, f"setup put of {k}: {r.code}")
                offsets[k] = r.replicas[0].offset
            rpc.call(m.BatchPutEnd(WRITER, chunk, [7] * len(chunk)))

        def check_echo(i: int, reply: Any) -> None:
            _expect(isinstance(reply, m.EchoReply) and reply.payload == b"x" * 16, "echo")

        def check_get(i: int, reply: Any) -> None:
            k = read_keys[i % n_read]
            _expect(
                reply.code == 0 and reply.replicas[0].offset == offsets[k] and reply.checksum == 7,
                f"get {k}: {reply}",
            )

        def check_batch_get(i: int, reply: Any) -> None:
            base = (i * BATCH) % n_read
            for j, r in enumerate(reply.results):
                k = read_keys[base + j]
                _expect(r.code == 0 and r.replicas[0].offset == offsets[k], f"batch get {k}")

        singles = plan.single_ops
        echo_reqs = [m.Echo(b"x" * 16)] * singles
        get_reqs = [m.GetReplicaList(read_keys[i % n_read]) for i in range(singles)]
        batch_get_reqs = [
            m.BatchGetReplicaList(read_keys[(i * BATCH) % n_read : (i * BATCH) % n_read + BATCH])
            for i in range(plan.batch_reqs)
        ]
        locate_reqs = [m.BatchGetLocations(r.keys) for r in batch_get_reqs]

        def check_locate(i: int, reply: Any) -> None:
            base = (i * BATCH) % n_read
            for j, (code, p) in enumerate(zip(reply.codes, reply.places, strict=True)):
                k = read_keys[base + j]
                _expect(code == 0 and p[1] == offsets[k], f"batch locate {k}")

        cases: list[tuple[str, str, int, float, Case]] = [
            ("echo", "lockstep", 1, 1, _lockstep(echo_reqs, check_echo)),
            ("get_replica_list", "lockstep", 1, 1, _lockstep(get_reqs, check_get)),
            ("echo", "pipelined", 1, 1, _pipelined(echo_reqs, check_echo, WINDOW)),
            ("get_replica_list", "pipelined", 1, 1, _pipelined(get_reqs, check_get, WINDOW)),
            ("put", "lockstep", 1, 2, _put_case(plan, False, 1)),
            ("put", "pipelined", 1, 2, _put_case(plan, True, 1)),
            (
                "batch_get_replica_list",
                "lockstep",
                BATCH,
                1 / BATCH,
                _lockstep(batch_get_reqs, check_batch_get),
            ),
            (
                "batch_get_replica_list",
                "pipelined",
                BATCH,
                1 / BATCH,
                _pipelined(batch_get_reqs, check_batch_get, BATCH_WINDOW),
            ),
            ("batch_put", "lockstep", BATCH, 2 / BATCH, _put_case(plan, False, BATCH)),
            ("batch_put", "pipelined", BATCH, 2 / BATCH, _put_case(plan, True, BATCH)),
            ("commit", "lockstep", 1, 1, _commit_case(plan, False, 1)),
            ("commit", "pipelined", 1, 1, _commit_case(plan, True, 1)),
            ("batch_commit", "lockstep", BATCH, 1 / BATCH, _commit_case(plan, False, BATCH)),
            ("batch_commit", "pipelined", BATCH, 1 / BATCH, _commit_case(plan, True, BATCH)),
            (
                "batch_get_locations",
                "lockstep",
                BATCH,
                1 / BATCH,
                _lockstep(locate_reqs, check_locate),
            ),
            (
                "batch_get_locations",
                "pipelined",
                BATCH,
                1 / BATCH,
                _pipelined(locate_reqs, check_locate, BATCH_WINDOW),
            ),
        ]
        # Warm both sides up (connections, code paths) before anything is timed.
        _lockstep(echo_reqs[:200], check_echo)(rpc, 0)
        _lockstep(get_reqs[:200], check_get)(rpc, 0)
        per_case: dict[int, list[_Measured]] = {i: [] for i in range(len(cases))}
        for rnd in range(plan.repeats):
            for i, (op, case, batch, calls_per_key, fn) in enumerate(cases):
                cpu0 = master.cpu_s()
                keys_done, seconds, lat = fn(rpc, rnd)
                # For batch cases the function counts requests for gets: scale to keys.
                gets = ("batch_get_replica_list", "batch_get_locations")
                keys = keys_done * batch if op in gets else keys_done
                per_case[i].append(
                    _Measured(
                        op,
                        case,
                        batch,
                        keys,
                        seconds,
                        lat,
                        master.cpu_s() - cpu0,
                        calls_per_key,
                        rpc.transport or "tcp",
                    )
                )
                log(f"round {rnd + 1}/{plan.repeats}: {op} {case} {keys / seconds:,.0f} keys/s")
        rows: list[dict[str, Any]] = []
        for i in range(len(cases)):
            chosen = median_row(per_case[i], lambda r: r.keys / r.seconds)
            rows.append(_row(chosen, plan.repeats, reclaim))
    finally:
        master.close()
    _add_ratios(rows)
    rows.append(measure_memory(plan.memory_objects, reclaim=False, log=log))
    rows.append(measure_memory(plan.memory_objects, reclaim=True, log=log))
    return rows


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each case's keys/s against echo requests/s of the same mode (lock-step or pipelined)."""
    echo = {r["case"]: r["ops_per_s"] for r in rows if r["op"] == "echo"}
    for r in rows:
        base = echo.get(r["case"])
        if base and r["op"] != "echo":
            r["ratio"] = r["keys_per_s"] / base
            r["baseline"] = f"echo {r['case']}"


def measure_memory(
    n: int, *, reclaim: bool, log: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """The master's RSS growth per stored object, for `n` objects with one memory replica
    (with `reclaim`, the reclaim hooks' own records are included)."""
    master = _Master(reclaim)
    try:
        rpc = master.rpc
        # Warm up the code paths (and their allocations) with a few objects, then remove them.
        warm = _keys("warm", 200)
        rpc.call(m.BatchPutStart(WRITER, warm, [OBJECT_SIZE] * len(warm)))
        rpc.call(m.BatchPutEnd(WRITER, warm))
        rpc.call(m.BatchGetReplicaList(warm))
        rpc.call(m.RemoveAll(force=True))
        before = master.rss()
        rng = random.Random(1)
        step = 2000
        t0 = time.perf_counter()
        for i in range(0, n, step):
            keys = [f"obj-{j:027x}" for j in range(i, min(n, i + step))]
            reply = rpc.call(m.BatchPutStart(WRITER, keys, [OBJECT_SIZE] * len(keys)))
            _expect(all(r.code == 0 for r in reply.results), "memory fill put")
            sums = [rng.getrandbits(64) for _ in keys]
            end = rpc.call(m.BatchPutEnd(WRITER, keys, sums))
            _expect(all(c == 0 for c in end.codes), "memory fill end")
        seconds = time.perf_counter() - t0
        stats = rpc.call(m.Stats())
        _expect(stats.objects == n, f"expected {n} objects, master has {stats.objects}")
        after = master.rss()
        log(
            f"memory (reclaim {'on' if reclaim else 'off'}): {n:,} objects in {seconds:.1f} s, "
            f"RSS {before >> 20} -> {after >> 20} MiB"
        )
    finally:
        master.close()
    return {
        "system": "kvpool",
        "path": "master",
        "op": "put",
        "metric": "master_bytes_per_object",
        "value": (after - before) / n,
        "objects": n,
        "key_bytes": 31,
        "replicas_per_object": 1,
        "reclaim": reclaim,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "fill_keys_per_s": n / seconds,
    }


def measure_lockstep_ratio(
    rounds: int,
    *,
    reclaim: bool,
    ops: int = 3000,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Lock-step GetReplicaList against lock-step Echo on one master, alternating `ops` of each
    for `rounds` rounds: the median of the per-round ratios (get/s over echo/s of the same
    round). Interleaving rounds this finely is what keeps the machine's load swings out of the
    ratio as much as anything can on a shared machine."""
    master = _Master(reclaim)
    try:
        rpc = master.rpc
        keys = _keys("read", ops)
        for i in range(0, ops, 1000):
            chunk = keys[i : i + 1000]
            started = rpc.call(m.BatchPutStart(WRITER, chunk, [OBJECT_SIZE] * len(chunk)))
            _expect(all(r.code == 0 for r in started.results), "lock-step setup put")
            rpc.call(m.BatchPutEnd(WRITER, chunk, [7] * len(chunk)))
        echo = [m.Echo(b"x" * 16)] * ops
        gets = [m.GetReplicaList(k) for k in keys]

        def rate(reqs: list[Any], check: Callable[[Any], bool]) -> float:
            call, t0 = rpc.call, time.perf_counter()
            for req in reqs:
                _expect(check(call(req)), f"lock-step reply to {type(req).__name__}")
            return len(reqs) / (time.perf_counter() - t0)

        def echo_ok(reply: Any) -> bool:
            return isinstance(reply, m.EchoReply)

        def get_ok(reply: Any) -> bool:
            return isinstance(reply, m.ReplicaListReply) and reply.code == 0

        rate(echo[:300], echo_ok)  # warm-up
        rate(gets[:300], get_ok)
        echo_rates: list[float] = []
        get_rates: list[float] = []
        for rnd in range(rounds):
            echo_rates.append(rate(echo, echo_ok))
            get_rates.append(rate(gets, get_ok))
            log(
                f"lock-step round {rnd + 1}/{rounds}: get/echo {get_rates[-1] / echo_rates[-1]:.2f}"
            )
    finally:
        master.close()
    ratios = [g / e for g, e in zip(get_rates, echo_rates, strict=True)]
    return {
        "system": "kvpool",
        "path": "master",
        "op": "get_replica_list",
        "metric": "lockstep_get_vs_echo",
        "value": statistics.median(ratios),
        "rounds": rounds,
        "ops_per_round": ops,
        "ratios": ratios,
        "echo_ops_per_s_median": statistics.median(echo_rates),
        "get_ops_per_s_median": statistics.median(get_rates),
        "reclaim": reclaim,
    }


_COLUMNS = (
    Column("op", "<24", lambda r: r["op"]),
    Column("case", "<11", lambda r: r["case"]),
    Column("batch", ">6", lambda r: str(r["batch"])),
    Column("ops/s", ">10", lambda r: f"{r['ops_per_s']:.0f}"),
    Column("keys/s", ">10", lambda r: f"{r['keys_per_s']:.0f}"),
    Column("p50 us", ">9", lambda r: f"{r['p50_us']:.1f}"),
    Column("p99 us", ">9", lambda r: f"{r['p99_us']:.1f}"),
    Column("master us/key", ">15", lambda r: f"{r['master_cpu_us_per_key']:.2f}"),
    Column("vs echo", ">9", lambda r: f"{r['ratio']:.2f}x" if r.get("ratio") is not None else "-"),
)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    speed = [r for r in rows if "metric" not in r]
    lines = [render_table(_COLUMNS, speed, sep=""), ""]
    for r in rows:
        if r.get("metric") == "lockstep_get_vs_echo":
            lines.append(
                f"lock-step get_replica_list / echo, reclaim {'on ' if r['reclaim'] else 'off'}: "
                f"median {r['value']:.2f}x over {r['rounds']} interleaved rounds (range "
                f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}; echo "
                f"{r['echo_ops_per_s_median']:,.0f}/s, get {r['get_ops_per_s_median']:,.0f}/s)"
            )
        if r.get("metric") == "master_bytes_per_object":
            lines.append(
                f"master memory, reclaim {'on ' if r['reclaim'] else 'off'}: {r['value']:.0f} "
                f"bytes of RSS per object ({r['objects']:,} objects, {r['key_bytes']}-byte keys, "
                f"one memory replica; filled at {r['fill_keys_per_s']:,.0f} keys/s)"
            )
    return "\n".join(lines)


@click.command()
@click.option("--quick", is_flag=True, help="A few seconds (used by the tests).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option("--repeats", type=click.IntRange(1, 20), help="Rounds per case (median).")
@click.option("--memory-objects", type=click.IntRange(1000), help="Objects for the memory row.")
@click.option(
    "--reclaim/--no-reclaim",
    default=True,
    show_default=True,
    help="Throughput cases against a master with (the default) or without reclaim hooks.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Throughput cases against a master keeping its operation log here (durable metadata).",
)
@click.option(
    "--lockstep-rounds",
    type=click.IntRange(1, 200),
    help="Only measure lock-step GetReplicaList against Echo, in this many interleaved rounds.",
)
@click.option(
    "--master-arg",
    "master_args",
    multiple=True,
    metavar="ARG",
    help="One more argument for the measured `kvpool master` (repeat it: "
    "--master-arg=--http-port --master-arg=0 measures a master serving metrics).",
)
def command(
    *,
    quick: bool,
    json_path: str | None,
    repeats: int | None,
    memory_objects: int | None,
    reclaim: bool,
    data_dir: str | None,
    lockstep_rounds: int | None,
    master_args: tuple[str, ...] = (),
) -> None:
    """Master control-plane throughput (ops/s, keys/s, master CPU per key) and bytes/object."""
    if lockstep_rounds is not None:
        row = measure_lockstep_ratio(
            lockstep_rounds,
            reclaim=reclaim,
            ops=300 if quick else 3000,
            log=lambda s: click.echo(s, err=True),
        )
        click.echo(format_table([row]))
        if json_path:
            write_json(json_path, [row])
        return
    plan = Plan.of(quick)
    if repeats is not None or memory_objects is not None:
        plan = Plan(
            plan.single_ops,
            plan.batch_reqs,
            repeats or plan.repeats,
            memory_objects or plan.memory_objects,
        )
    rows = run(
        plan,
        reclaim,
        log=lambda s: click.echo(s, err=True),
        data_dir=data_dir,
        master_args=master_args,
    )
    click.echo(format_table(rows))
    if json_path:
        click.echo(f"wrote {write_json(json_path, rows)} rows to {json_path}")
