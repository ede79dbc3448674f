"""`kvpool bench reclaim`: hit ratio under scans, cost per eviction, put tail latency.

Every case drives the master's own reclaim code (`kvpool.master.reclaim.ReclaimEngine`) through
`SimulatedPool`, an in-memory metadata table with a byte-counting allocator and a PutStart-like
path (allocate → on failure one direct reclaim → retry once). The baselines are simulated in the
same run on the same trace:

* **hot_hit_ratio** (scan resistance). A hot set of 30 % of capacity is read with a Zipf
  distribution; after a warm-up (10 reads per hot key on average, not measured) three one-pass
  sequential scans of one capacity each (3x capacity in all) run, with hot reads continuing at
  one per nine scan keys, and one hot-set-size of hot reads after each scan. A read that misses
  puts the object (a cache fill). Measured: hit ratio of the hot reads after the warm-up.
  Systems: `kvpool` (the engine, kswapd run whenever it wants, direct reclaim on a failed put),
  `lru` (an exact LRU of the same capacity), `lease_lru` (Mooncake's BatchEvict:
  every 10 ms evict ceil(5 % of objects) with the smallest lease deadline among those
  whose lease expired, when above the 90 % watermark or after a failed put; a failed put is
  not retried; reads extend the lease to now + 10 s, PutEnd sets it to now; the trace clock
  moves 1 ms per operation).
* **evict_us_per_object**: time of a kswapd pass that evicts 1,000 objects, divided by 1,000,
  with 10k, 100k and 1M objects resident (`--quick`: 5k and 50k), refilled between rounds;
  the sizes take turns within each round; median of rounds.
* **put_p99_us**: p99 of one put (PutStart + PutEnd with its reclaim hooks) with n objects
  resident, in a pool with room for n more (pressure false) and in a full pool of n under
  sustained puts (pressure true), where kswapd runs one bounded step whenever it wants between
  puts, as the master's loop runs it. The cases alternate within each round; the median of
  the per-round p99s is reported. A third case puts with kswapd off, so every put pays a
  direct reclaim (`direct_put_p99_us`), and the kswapd step p99 (`kswapd_step_p99_us`: what a
  put arriving mid-step may wait) is reported too. Rows with system `kvpool-master` measure
  the same two cases through the real `MasterService` with `MasterReclaimHooks` (in process,
  no RPC; PutStart + PutEnd messages; the event loop gets a turn between puts, where the
  hooks' kswapd steps run).

Times are wall clock (`value`) and this thread's CPU time (`cpu_us`, `cpu_p99_us`): on a shared
machine, wall-clock tails mostly measure the scheduler, CPU time the code.
"""

from __future__ import annotations

import gc
import heapq
import math
import statistics
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import numpy as np

from kvpool.bench.rows import percentile, write_json
from kvpool.errors import ErrorCode
from kvpool.master.reclaim import ReclaimConfig
from kvpool.master.reclaim.simulated import ManualClock, SimulatedPool

__all__ = ["command"]

OBJ = 4096
SHARDS = 64  # the master's default num_shards


@dataclass(frozen=True, slots=True)
class Scale:
    capacity: int
    """Objects that fit in the pool of the hit-ratio trace."""
    resident: tuple[int, ...]
    """Resident object counts of the cost case."""
    cost_rounds: int
    put_objects: int
    """Capacity (objects) of the put-latency pool, and puts per round."""
    put_rounds: int


QUICK = Scale(
    capacity=2_000, resident=(5_000, 50_000), cost_rounds=3, put_objects=3_000, put_rounds=3
)
FULL = Scale(
    capacity=20_000,
    resident=(10_000, 100_000, 1_000_000),
    cost_rounds=7,
    put_objects=50_000,
    put_rounds=7,
)


@contextmanager
def _no_gc() -> Iterator[None]:
    # Millions of small records make the cyclic GC's full passes dominate the timings.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------- scan resistance


@dataclass(frozen=True, slots=True)
class Trace:
    keys: list[str]
    warm: int
    """Operations before this index are the warm-up (not measured)."""


def make_trace(capacity: int, alpha: float, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    hot = int(0.3 * capacity)
    weights = 1.0 / np.arange(1, hot + 1) ** alpha
    weights /= weights.sum()
    perm = rng.permutation(hot)

    def hot_reads(n: int) -> list[str]:
        return [f"h{k}" for k in perm[rng.choice(hot, size=n, p=weights)]]

    keys = hot_reads(10 * hot)
    warm = len(keys)
    scanned = 0
    for _ in range(3):
        mixed_hot = hot_reads(capacity // 9)
        n = capacity + len(mixed_hot)
        is_scan = np.zeros(n, dtype=bool)
        is_scan[rng.choice(n, capacity, replace=False)] = True
        it = iter(mixed_hot)
        for s in is_scan:
            if s:
                keys.append(f"s{scanned}")
                scanned += 1
            else:
                keys.append(next(it))
        keys.extend(hot_reads(hot))
    return Trace(keys, warm)


def _hits(trace: Trace, lookup_or_fill: Any) -> float:
    hits = total = 0
    for i, key in enumerate(trace.keys):
        hit = lookup_or_fill(key)
        if i >= trace.warm and key[0] == "h":
            total += 1
            hits += hit
    return hits / max(1, total)


def run_kvpool(trace: Trace, capacity: int) -> float:
    pool = SimulatedPool(capacity * OBJ, ReclaimConfig(), num_shards=SHARDS, clock=ManualClock())
    engine = pool.engine

    def step(key: str) -> bool:
        if pool.get(key):
            return True
        pool.put(key, OBJ)
        while engine.kswapd_wanted():
            r = engine.kswapd_step()
            if r.freed + r.pending == 0:
                break
        return False

    return _hits(trace, step)


def run_lru(trace: Trace, capacity: int) -> float:
    lru: OrderedDict[str, None] = OrderedDict()

    def step(key: str) -> bool:
        if key in lru:
            lru.move_to_end(key)
            return True
        lru[key] = None
        if len(lru) > capacity:
            lru.popitem(last=False)
        return False

    return _hits(trace, step)


def run_lease_lru(trace: Trace, capacity: int, lease_ops: int = 10_000) -> float:
    """Mooncake's approximate LRU over lease deadlines (its BatchEvict), 1 ms per op."""
    lease: dict[str, int] = {}
    heap: list[tuple[int, str]] = []
    state = {"now": 0, "need": False}
    high, ratio = 0.9, 0.05

    def batch_evict() -> None:
        used = len(lease) / capacity
        target = max(ratio, used - high + ratio)
        ideal = math.ceil(len(lease) * target)
        now = state["now"]
        evicted = 0
        while heap and evicted < ideal:
            deadline, key = heap[0]
            if lease.get(key) != deadline:
                heapq.heappop(heap)  # superseded by a later lease
                continue
            if deadline > now:
                break  # every other candidate is leased too
            heapq.heappop(heap)
            del lease[key]
            evicted += 1
        state["need"] = False

    def step(key: str) -> bool:
        state["now"] += 1
        now = state["now"]
        if now % 10 == 0 and (len(lease) > high * capacity or state["need"]):
            batch_evict()
        if key in lease:
            deadline = max(lease[key], now + lease_ops)
            if deadline != lease[key]:
                lease[key] = deadline
                heapq.heappush(heap, (deadline, key))
            return True
        if len(lease) >= capacity:
            state["need"] = True  # PutStart fails with NO_AVAILABLE_HANDLE; no retry
            return False
        lease[key] = now
        heapq.heappush(heap, (now, key))
        return False

    return _hits(trace, step)


def scan_resistance(scale: Scale, alpha: float, seed: int = 1) -> dict[str, float]:
    trace = make_trace(scale.capacity, alpha, seed)
    return {
        "kvpool": run_kvpool(trace, scale.capacity),
        "lru": run_lru(trace, scale.capacity),
        "lease_lru": run_lease_lru(trace, scale.capacity),
    }


# ---------------------------------------------------------------- cost per eviction


def evict_cost(
    residents: tuple[int, ...], rounds: int, per_round: int = 1_000
) -> dict[int, tuple[float, float]]:
    """Microseconds per evicted object of a kswapd pass, by resident object count: (median
    wall clock, median CPU time of this thread). The pools are built first and measured in
    turn within every round, so load on a shared machine hits every size alike."""
    pools = {
        n: SimulatedPool(n * OBJ, ReclaimConfig(), num_shards=SHARDS, clock=ManualClock())
        for n in residents
    }
    walls: dict[int, list[float]] = {n: [] for n in residents}
    cpus: dict[int, list[float]] = {n: [] for n in residents}
    serial = 0
    with _no_gc():
        for n, pool in pools.items():
            for _ in range(n):
                pool.put(f"k{serial}", OBJ)
                serial += 1
        for _ in range(rounds):
            for n, pool in pools.items():
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                result = pool.engine.kswapd_pass(per_round * OBJ)
                c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                evicted = result.freed // OBJ
                if evicted != per_round:
                    raise click.ClickException(f"evicted {evicted} objects, expected {per_round}")
                walls[n].append((w1 - w0) / 1000 / evicted)
                cpus[n].append((c1 - c0) / 1000 / evicted)
                for _ in range(evicted):
                    pool.put(f"k{serial}", OBJ)
                    serial += 1
                if len(pool.objects) != n:
                    raise click.ClickException(f"{len(pool.objects)} resident, expected {n}")
    del pools
    gc.collect()
    return {n: (statistics.median(walls[n]), statistics.median(cpus[n])) for n in residents}


# ---------------------------------------------------------------- put latency


def _p99(ns: list[int]) -> float:
    return percentile(ns, 0.99) / 1000


def put_latency(scale: Scale) -> dict[str, float]:
    """Median over rounds of the put p99 (us) per case: no pressure ("none"), kswapd steady
    state ("kswapd"), kswapd off so every put reclaims directly ("direct"), and kswapd's own
    steps ("step"). Each has a wall-clock value and a "_cpu" one (this thread's CPU time: on a
    shared machine, wall-clock tails mostly measure the scheduler). Even-numbered puts are
    timed by the wall clock, odd ones by the CPU clock, so neither timing sits inside the
    other."""
    n = scale.put_objects
    p99s: dict[str, list[float]] = {}
    serial = 0
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    with _no_gc():
        for _ in range(scale.put_rounds):
            for case in ("none", "kswapd", "direct"):
                # Every case starts with n objects resident (same table sizes); "none" has
                # room for all the puts that follow, the others start full.
                cap = 4 * n if case == "none" else n
                pool = SimulatedPool(
                    cap * OBJ, ReclaimConfig(), num_shards=SHARDS, clock=ManualClock()
                )
                engine = pool.engine
                for i in range(n):
                    pool.put(f"f{serial}-{i}", OBJ)
                if case == "kswapd":
                    engine.kswapd_pass()  # the steady state: kswapd caught up
                samples: dict[str, list[int]] = {case: [], f"{case}_cpu": []}
                steps: dict[str, list[int]] = {"step": [], "step_cpu": []}
                for i in range(n):
                    key = f"p{serial}-{i}"
                    clock, suffix = (wall, "") if i % 2 == 0 else (cpu, "_cpu")
                    t0 = clock()
                    code = pool.put(key, OBJ)
                    samples[case + suffix].append(clock() - t0)
                    if code is not ErrorCode.OK:
                        raise click.ClickException(f"put {key} failed: {code.name}")
                    if case == "kswapd" and engine.kswapd_wanted():
                        t1 = clock()
                        engine.kswapd_step()
                        steps["step" + suffix].append(clock() - t1)
                serial += 1
                for name, ns in (samples | steps).items():
                    if ns:
                        p99s.setdefault(name, []).append(_p99(ns))
                if case == "kswapd" and engine.stats.direct_calls:
                    raise click.ClickException("kswapd fell behind: a put needed direct reclaim")
                if case == "direct" and engine.stats.direct_calls != n:
                    raise click.ClickException("not every put reclaimed directly")
                del pool, engine
            gc.collect()
    return {k: statistics.median(v) for k, v in p99s.items()}


def master_put_latency(n: int, rounds: int) -> dict[str, float]:
    """The put p99 through the real `MasterService` with `MasterReclaimHooks` (no RPC): one
    segment, n objects resident, PutStart + PutEnd timed, the event loop given a turn between
    puts (where kswapd's step callbacks run, as in `kvpool master`). "none": the segment has
    room for n more; "kswapd": it starts full. Median over rounds of the p99, wall and CPU."""
    import asyncio

    from kvpool.master.config import MasterConfig
    from kvpool.master.reclaim.adapter import MasterReclaimHooks
    from kvpool.master.service import MasterService
    from kvpool.protocol import messages as m

    node, writer, host = m.ClientId("node"), m.ClientId("writer"), m.HostId("host")
    p99s: dict[str, list[float]] = {}

    async def one(case: str, serial: int) -> None:
        hooks = MasterReclaimHooks()
        svc = MasterService(MasterConfig(default_kv_lease_ttl=0.0, seed=1), hooks=hooks)
        size = (4 if case == "none" else 1) * n * OBJ
        info = m.SegmentInfo(m.SegmentName("seg"), size, host, "127.0.0.1:1", "")
        svc.handle(m.MountSegment(node, host, info))
        for i in range(n):
            svc.handle(m.PutStart(writer, f"f{serial}-{i}", OBJ))
            svc.handle(m.PutEnd(writer, f"f{serial}-{i}", 1))
        while hooks.engine.kswapd_wanted():
            await asyncio.sleep(0)
        samples: dict[str, list[int]] = {case: [], f"{case}_cpu": []}
        wall, cpu = time.perf_counter_ns, time.thread_time_ns
        for i in range(n):
            key = f"p{serial}-{i}"
            clock, suffix = (wall, "") if i % 2 == 0 else (cpu, "_cpu")
            t0 = clock()
            start = svc.handle(m.PutStart(writer, key, OBJ))
            end = svc.handle(m.PutEnd(writer, key, 1))
            samples[case + suffix].append(clock() - t0)
            if not (isinstance(start, m.PutStartReply) and start.code == 0):
                raise click.ClickException(f"master PutStart {key}: {start}")
            if not (isinstance(end, m.Reply) and end.code == 0):
                raise click.ClickException(f"master PutEnd {key}: {end}")
            await asyncio.sleep(0)  # the loop's turn: kswapd steps run here
        if case == "kswapd" and hooks.engine.stats.kswapd_steps == 0:
            raise click.ClickException("the master's kswapd never ran under pressure")
        for name, ns in samples.items():
            p99s.setdefault(name, []).append(_p99(ns))

    with _no_gc():
        for r in range(rounds):
            for case in ("none", "kswapd"):
                asyncio.run(one(case, 2 * r + (case == "kswapd")))
            gc.collect()
    return {k: statistics.median(v) for k, v in p99s.items()}


# ---------------------------------------------------------------- command


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'metric':<22} {'case':<34} {'value':>10}"]
    for r in rows:
        case = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("metric", "value"))
        lines.append(f"{r['metric']:<22} {case:<34} {r['value']:>10.3f}")
    return "\n".join(lines)


@click.command("reclaim")
@click.option("--quick", is_flag=True, help="Seconds, not minutes (what the tests run).")
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write rows here.")
@click.option("--alpha", type=float, default=0.8, show_default=True, help="Zipf skew of hot reads.")
def command(quick: bool, json_file: str | None, alpha: float) -> None:
    """Reclaim: hot-set hit ratio under scans, cost per eviction, put p99 under pressure."""
    scale = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []

    hits = scan_resistance(scale, alpha)
    for system, value in hits.items():
        rows.append(
            {
                "metric": "hot_hit_ratio",
                "system": system,
                "value": value,
                "capacity_objects": scale.capacity,
                "zipf_alpha": alpha,
            }
        )
    if not quick:
        for a in (0.6, 1.0):
            for system, value in scan_resistance(scale, a).items():
                rows.append(
                    {
                        "metric": "hot_hit_ratio_sweep",
                        "system": system,
                        "value": value,
                        "zipf_alpha": a,
                    }
                )

    costs = evict_cost(scale.resident, scale.cost_rounds)
    for n, (us, cpu_us) in costs.items():
        rows.append(
            {
                "metric": "evict_us_per_object",
                "system": "kvpool",
                "resident_objects": n,
                "value": us,
                "cpu_us": cpu_us,
            }
        )

    lat = put_latency(scale)
    for metric, case, pressure in (
        ("put_p99_us", "none", False),
        ("put_p99_us", "kswapd", True),
        ("direct_put_p99_us", "direct", True),
        ("kswapd_step_p99_us", "step", True),
    ):
        rows.append(
            {
                "metric": metric,
                "system": "kvpool",
                "pressure": pressure,
                "value": lat.get(case, 0.0),
                "cpu_p99_us": lat.get(case + "_cpu", 0.0),
            }
        )

    live = master_put_latency(scale.put_objects // 2, scale.put_rounds)
    for case, pressure in (("none", False), ("kswapd", True)):
        rows.append(
            {
                "metric": "put_p99_us",
                "system": "kvpool-master",
                "pressure": pressure,
                "value": live[case],
                "cpu_p99_us": live[case + "_cpu"],
            }
        )

    click.echo(_table(rows))
    (small_wall, small_cpu), (large_wall, large_cpu) = costs[min(costs)], costs[max(costs)]
    click.echo(
        f"hot hit ratio kvpool/lru: {hits['kvpool'] / max(hits['lru'], 1e-9):.2f}x, "
        f"kvpool/lease_lru: {hits['kvpool'] / max(hits['lease_lru'], 1e-9):.2f}x; "
        f"eviction cost {max(costs)}/{min(costs)} resident: {large_wall / small_wall:.2f}x wall, "
        f"{large_cpu / small_cpu:.2f}x cpu; "
        f"put p99 under pressure / without: {lat['kswapd'] / lat['none']:.2f}x wall, "
        f"{lat['kswapd_cpu'] / lat['none_cpu']:.2f}x cpu, through MasterService "
        f"{live['kswapd'] / live['none']:.2f}x wall, {live['kswapd_cpu'] / live['none_cpu']:.2f}x "
        f"cpu (direct reclaim on every put: "
        f"{lat['direct'] / lat['none']:.2f}x wall, {lat['direct_cpu'] / lat['none_cpu']:.2f}x cpu)"
    )
    if json_file:
        click.echo(f"wrote {write_json(json_file, rows)} rows to {json_file}")
