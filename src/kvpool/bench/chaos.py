"""`kvpool bench chaos`: what a pool keeps of acknowledged writes through crashes, freezes and
garbage on the wire (issue #13's instrument).

Setup: a `kvpool master` and three `kvpool node`s as child processes on 127.0.0.1 (the embedded
pool), and this process as the client: one `Store` per data path (shared memory, the default on
one host, and TCP forced with `protocol="tcp"`), each with a writer thread and a reader thread.
Writers put fresh keys with `ReplicateConfig(replica_num=2)` at a steady pace; every value is a
pure function of its key (`chaos_faults.ValueShape`: 4 KiB .. 1 MiB, log-uniform), so any read,
during the run or at its end, is checked byte for byte. Readers get random acknowledged keys.

The events, at fixed times from the start of the workload (`Plan`):

1. node 0 is SIGKILLed (no unmount: the master must notice by itself, after `client_ttl`);
2. node 1 is frozen with SIGSTOP for longer than `client_ttl` (the master expires it), then
   SIGCONT (it remounts an empty segment). The gap between 1 and 2 is the time a repair would
   have to bring every object back to two replicas on the two survivors;
3. a burst of malformed frames at the master's TCP port over many short connections
   (`chaos_faults.malformed_burst`);
4. idle sockets to the master and to node 2's transfer server, held, then closed.

Then the writers stop, the pool settles for two `client_ttl`s, and every acknowledged key is read
back. The rows (`{"system": "kvpool", "metric": ..., "value": ...}`): `acked_puts`, `lost_acked`
(acknowledged keys that no longer read back, by path and by the phase they were written in),
`wrong_bytes` (reads whose bytes differ from what was put), `put_failures_below_90pct` (puts that
failed while the pool, by the master's Stats, was under 90% used), `master_rss_growth_mb` (the
master's RSS before the malformed burst against after the read-back), `time_to_full_replication_s`
(from the SIGKILL until every surviving acknowledged object has `replica_num` complete replicas
on live segments; null, `"result": "never"`, when that did not happen before the read-back),
`under_replicated_at_end`, put latency per phase, the faults' own counts, and put and get errors
by error code. The benchmark asserts nothing: it reports what happened.

Every process it starts is stopped by its PID in a `finally` (a frozen node is sent SIGCONT
first), also on Ctrl-C; segments are memfds, so nothing is left in /dev/shm.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import psutil

from kvpool.bench.chaos_faults import IdleFlood, ValueShape, malformed_burst, raise_fd_limit
from kvpool.bench.rows import Column, percentile, render_table, write_json
from kvpool.client.embedded import EmbeddedPool, PoolSpec
from kvpool.client.replicate import ReplicateConfig
from kvpool.client.store import Store
from kvpool.config import format_size
from kvpool.errors import KVPoolError
from kvpool.protocol.messages import (
    BatchGetReplicaList,
    BatchReplicaListReply,
    ReplicaStatus,
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient

__all__ = ["METRICS", "Plan", "command", "format_table", "run"]

log = logging.getLogger(__name__)

MiB = 1 << 20
REPLICAS = 2
CONFIG = ReplicateConfig(replica_num=REPLICAS)
PATHS = {"shm": "auto", "tcp": "tcp"}
"""Row path -> the Store's `protocol`."""
FULL = 0.9
"""Pool use at and above which a failed put is not counted as a failure below 90%."""

METRICS = (
    "scenario_s",
    "acked_puts",
    "lost_acked",
    "wrong_bytes",
    "reads_checked",
    "put_failures_below_90pct",
    "pool_use_max",
    "master_rss_growth_mb",
    "time_to_full_replication_s",
    "under_replicated_at_end",
    "segments_at_end",
    "malformed_connections",
    "master_answers_after_burst",
    "idle_sockets",
    "put_errors_total",
    "get_errors_total",
)
"""The metrics every run reports (put/get errors per code and latency per phase come on top)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """The scenario's sizes and its timeline (seconds from the start of the workload)."""

    segment_size: int
    """Bytes of each of the three nodes' segments."""
    client_ttl_s: float
    keys_per_writer: int
    """Puts each writer makes (two writers: shm and tcp), spread evenly until `write_until`."""
    kill_at: float
    freeze_at: float
    freeze_s: float
    """How long node 1 stays stopped (longer than `client_ttl_s`)."""
    burst_at: float
    burst_connections: int
    flood_at: float
    flood_sockets: int
    """Idle sockets to the master, and as many to node 2's transfer server."""
    flood_s: float
    write_until: float
    transfer_timeout_s: float
    reader_pause_s: float

    @staticmethod
    def of(quick: bool) -> Plan:
        if quick:
            return Plan(
                segment_size=64 * MiB,
                client_ttl_s=3.0,
                keys_per_writer=80,
                kill_at=2.0,
                freeze_at=6.5,
                freeze_s=4.5,
                burst_at=12.0,
                burst_connections=140,
                flood_at=13.0,
                flood_sockets=100,
                flood_s=2.0,
                write_until=16.0,
                transfer_timeout_s=3.0,
                reader_pause_s=0.02,
            )
        return Plan(
            segment_size=384 * MiB,
            client_ttl_s=5.0,
            keys_per_writer=500,
            kill_at=15.0,
            freeze_at=45.0,
            freeze_s=10.0,
            burst_at=65.0,
            burst_connections=700,
            flood_at=80.0,
            flood_sockets=300,
            flood_s=15.0,
            write_until=110.0,
            transfer_timeout_s=5.0,
            reader_pause_s=0.01,
        )

    @property
    def settle_s(self) -> float:
        return 2 * self.client_ttl_s


# ---------------------------------------------------------------- what happened


@dataclass(slots=True)
class PutRecord:
    key: str
    path: str
    t: float
    """Start, seconds from the start of the workload."""
    latency_s: float
    code: str
    """"OK", or the error code's name (an exception's class name when it carried none)."""
    pool_use: float | None


@dataclass(slots=True)
class Record:
    """Everything the threads observe; every field under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    puts: list[PutRecord] = field(default_factory=list)
    acked: list[PutRecord] = field(default_factory=list)
    get_errors: Counter[str] = field(default_factory=Counter)
    reads_checked: int = 0
    wrong_bytes: int = 0
    wrong_keys: list[str] = field(default_factory=list)
    pool_use: float | None = None
    pool_use_max: float = 0.0
    events: list[tuple[str, float]] = field(default_factory=list)
    full_replication_s: float | None = None

    def check(self, key: str, got: bytes | bytearray, want: bytes) -> None:
        with self.lock:
            self.reads_checked += 1
            if got != want:
                self.wrong_bytes += 1
                if len(self.wrong_keys) < 20:
                    self.wrong_keys.append(key)


def _code_of(exc: BaseException) -> str:
    return exc.code.name if isinstance(exc, KVPoolError) else type(exc).__name__


# ---------------------------------------------------------------- the scenario


class Scenario:
    """One run: start the pool, run the workload and the events, read back, stop everything."""

    def __init__(self, plan: Plan, shape: ValueShape | None = None, seed: int = 13) -> None:
        self.plan = plan
        self.shape = shape or ValueShape()
        self.rec = Record()
        self.seed = seed
        self._stop_writes = threading.Event()
        self._stop_all = threading.Event()
        self._dead_segments: set[str] = set()
        self._kill_t: float | None = None
        self._start = 0.0
        self.under_replicated_at_end = 0
        self.lost: list[PutRecord] = []
        self.final_get_errors: Counter[str] = Counter()

    def now(self) -> float:
        return time.monotonic() - self._start

    def _event(self, name: str) -> None:
        with self.rec.lock:
            self.rec.events.append((name, round(self.now(), 3)))
        log.info("chaos: %s at %.2f s", name, self.now())

    def _at(self, t: float) -> None:
        # The events run at fixed times by design (the scenario is a timeline, not a condition).
        time.sleep(max(0.0, self._start + t - time.monotonic()))

    # ------------------------------------------------------------ threads

    def _writer(self, path: str, store: Store) -> None:
        plan = self.plan
        interval = plan.write_until / plan.keys_per_writer
        for i in range(plan.keys_per_writer):
            if self._stop_writes.wait(max(0.0, self._start + i * interval - time.monotonic())):
                return
            if self.now() > plan.write_until:
                return
            key = f"chaos/{path}/{i:06d}"
            value = self.shape.value_for(key)
            t = self.now()
            try:
                code = "OK" if store.put(key, value, CONFIG) else "OBJECT_ALREADY_EXISTS"
            except Exception as exc:  # every failure is data here, whatever its kind
                code = _code_of(exc)
            rec = PutRecord(key, path, t, self.now() - t, code, self.rec.pool_use)
            with self.rec.lock:
                self.rec.puts.append(rec)
                if code == "OK":
                    self.rec.acked.append(rec)

    def _reader(self, path: str, store: Store) -> None:
        rng = random.Random(f"{self.seed}-{path}")
        while not self._stop_all.wait(self.plan.reader_pause_s):
            with self.rec.lock:
                if not self.rec.acked:
                    continue
                key = rng.choice(self.rec.acked).key
            try:
                got = store.get(key)
            except Exception as exc:
                with self.rec.lock:
                    self.rec.get_errors[_code_of(exc)] += 1
                continue
            self.rec.check(key, got, self.shape.value_for(key))

    def _monitor(self, rpc: RpcClient) -> None:
        next_replication = 0.0
        while not self._stop_all.wait(0.25):
            try:
                stats = rpc.call_as(Stats(), StatsReply)
            except Exception as exc:
                log.info("chaos monitor: Stats failed: %s", exc)
                continue
            use = stats.used / stats.capacity if stats.capacity else None
            with self.rec.lock:
                self.rec.pool_use = use
                self.rec.pool_use_max = max(self.rec.pool_use_max, use or 0.0)
            if (
                self._kill_t is not None
                and self.rec.full_replication_s is None
                and time.monotonic() >= next_replication
            ):
                next_replication = time.monotonic() + 1.0
                with self.rec.lock:
                    any_acked = bool(self.rec.acked)
                try:
                    if any_acked and self._under_replicated(rpc) == 0:  # not vacuously
                        self.rec.full_replication_s = self.now() - self._kill_t
                        self._event("full replication")
                except Exception as exc:
                    log.info("chaos monitor: replica check failed: %s", exc)

    def _under_replicated(self, rpc: RpcClient) -> int:
        """Acknowledged objects that exist with fewer than REPLICAS complete replicas on live
        segments (the killed node's segments are dead even before the master notices)."""
        with self.rec.lock:
            keys = [r.key for r in self.rec.acked]
        short = 0
        for i in range(0, len(keys), 512):
            chunk = keys[i : i + 512]
            rep = rpc.call_as(BatchGetReplicaList(chunk), BatchReplicaListReply)
            for r in rep.results:
                if r.code != 0:
                    continue  # gone: lost_acked counts it, not this
                live = [
                    d
                    for d in r.replicas
                    if d.status == ReplicaStatus.COMPLETE and d.segment not in self._dead_segments
                ]
                if len(live) < REPLICAS:
                    short += 1
        return short

    # ------------------------------------------------------------ events

    def _segments_of(self, rpc: RpcClient, endpoint: str) -> set[str]:
        stats = rpc.call_as(Stats(), StatsReply)
        return {s.name for s in stats.segments if s.endpoint == endpoint}

    def _timeline(self, pool: EmbeddedPool, rpc: RpcClient, frozen: list[int]) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {}
        master = pool.master
        assert master is not None
        host, port = pool.address.rsplit(":", 1)

        self._at(plan.kill_at)
        self._dead_segments = self._segments_of(rpc, pool.node_endpoints[0])
        pool.nodes[0].kill9()
        self._kill_t = self.now()
        self._event("SIGKILL node 0")

        self._at(plan.freeze_at)
        pid1 = pool.nodes[1].pid
        os.kill(pid1, signal.SIGSTOP)
        frozen.append(pid1)
        self._event("SIGSTOP node 1")
        self._at(plan.freeze_at + plan.freeze_s)
        os.kill(pid1, signal.SIGCONT)
        frozen.remove(pid1)
        self._event("SIGCONT node 1")

        self._at(plan.burst_at)
        ps = psutil.Process(master.pid)
        out["rss_before"] = ps.memory_info().rss
        self._event("malformed burst")
        burst = malformed_burst(host, int(port), plan.burst_connections, deadline_s=10.0)
        out["burst"] = burst
        try:
            rpc.call_as(Stats(), StatsReply, timeout=5.0)
            out["answers_after_burst"] = master.alive()
        except Exception:
            out["answers_after_burst"] = False
        self._event("malformed burst done")

        self._at(plan.flood_at)
        flood = IdleFlood()
        out["flood"] = flood
        try:
            self._event("idle flood")
            node_host, node_port = pool.node_endpoints[2].rsplit(":", 1)
            flood.open("master", (host, int(port)), plan.flood_sockets, deadline_s=10.0)
            flood.open("node", (node_host, int(node_port)), plan.flood_sockets, deadline_s=10.0)
            self._at(plan.flood_at + plan.flood_s)
            flood.count_closed_by_server()
        finally:
            flood.close()
        self._event("idle flood closed")

        self._at(plan.write_until)
        self._stop_writes.set()
        self._event("writes stop")
        self._at(plan.write_until + plan.settle_s)
        return out

    # ------------------------------------------------------------ run

    def run(self) -> list[dict[str, Any]]:
        plan = self.plan
        raise_fd_limit(4 * plan.flood_sockets + 1024)
        pool = EmbeddedPool(
            PoolSpec(segment_size=plan.segment_size, nodes=3, client_ttl=plan.client_ttl_s)
        )
        stores: dict[str, Store] = {}
        threads: list[threading.Thread] = []
        frozen: list[int] = []
        rpc: RpcClient | None = None
        t_begin = time.monotonic()
        try:
            address = pool.start()
            rpc = RpcClient(address, response_type=Response, timeout=5.0, client_name="chaos")
            for path, proto in PATHS.items():
                stores[path] = Store(
                    address,
                    protocol=proto,
                    rpc_timeout=5.0,
                    transfer_timeout=plan.transfer_timeout_s,
                    heartbeat_interval=min(1.0, plan.client_ttl_s / 4),
                )
                stores[path].warm_up()  # map the segments now, not in the first puts' latency
            self._start = time.monotonic()

            def spawn(name: str, fn: Callable[..., None], *args: Any) -> None:
                t = threading.Thread(target=fn, args=args, name=f"chaos-{name}", daemon=True)
                t.start()
                threads.append(t)

            spawn("monitor", self._monitor, rpc)
            for path, store in stores.items():
                spawn(f"write-{path}", self._writer, path, store)
                spawn(f"read-{path}", self._reader, path, store)
            faults = self._timeline(pool, rpc, frozen)
            faults["address"] = address
            self._stop_all.set()
            for t in threads:
                t.join(timeout=plan.transfer_timeout_s + 10)
            self._event("read-back")
            self.under_replicated_at_end = self._under_replicated(rpc)
            faults["stats_at_end"] = rpc.call_as(Stats(), StatsReply)
            self._read_back(stores)
            master = pool.master
            assert master is not None
            faults["rss_after"] = psutil.Process(master.pid).memory_info().rss
            faults["master_alive"] = master.alive()
            return self._rows(faults, time.monotonic() - t_begin)
        finally:
            self._stop_writes.set()
            self._stop_all.set()
            for pid in frozen:  # a stopped process would not act on SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            for t in threads:
                t.join(timeout=plan.transfer_timeout_s + 10)
            for store in stores.values():
                store.close()
            if rpc is not None:
                rpc.close()
            pool.close()

    def _read_back(self, stores: dict[str, Store]) -> None:
        """Every acknowledged key, through its writer's path, then the other path on a miss."""
        with self.rec.lock:
            acked = list(self.rec.acked)
        for rec in acked:
            want = self.shape.value_for(rec.key)
            got: bytearray | None = None
            for path in (rec.path, *(p for p in stores if p != rec.path)):
                try:
                    got = stores[path].get(rec.key)
                    break
                except Exception as exc:
                    self.final_get_errors[_code_of(exc)] += 1
            if got is None:
                self.lost.append(rec)
            else:
                self.rec.check(rec.key, got, want)

    # ------------------------------------------------------------ rows

    def _phase_of(self, t: float) -> str:
        phase = "steady"
        for name, at in self.rec.events:
            if at > t:
                break
            if name != "full replication":  # an observation, not something done to the pool
                phase = name
        return phase

    def _rows(self, faults: dict[str, Any], total_s: float) -> list[dict[str, Any]]:
        plan, rec = self.plan, self.rec

        def row(metric: str, value: Any, **extra: Any) -> dict[str, Any]:
            return {"system": "kvpool", "metric": metric, "value": value, **extra}

        events = [{"event": n, "t_s": t} for n, t in rec.events]
        put_errors = Counter(p.code for p in rec.puts if p.code != "OK")
        below = sum(
            1 for p in rec.puts if p.code != "OK" and (p.pool_use is None or p.pool_use < FULL)
        )
        lost_by_phase = Counter(self._phase_of(r.t) for r in self.lost)
        lost_by_path = Counter(r.path for r in self.lost)
        burst = faults["burst"]
        flood: IdleFlood = faults["flood"]
        growth = (faults["rss_after"] - faults["rss_before"]) / MiB
        end: StatsReply = faults["stats_at_end"]
        rows = [
            row(
                "scenario_s",
                round(total_s, 1),
                nodes=3,
                segment_size=plan.segment_size,
                client_ttl_s=plan.client_ttl_s,
                replica_num=REPLICAS,
                value_sizes=[self.shape.min_size, self.shape.max_size],
                events=events,
                master=faults["address"],
            ),
            row("acked_puts", len(rec.acked), attempted=len(rec.puts)),
            row(
                "lost_acked",
                len(self.lost),
                by_path=dict(lost_by_path),
                by_phase=dict(lost_by_phase),
                examples=[r.key for r in self.lost[:10]],
            ),
            row("wrong_bytes", rec.wrong_bytes, examples=rec.wrong_keys),
            row("reads_checked", rec.reads_checked),
            row("put_failures_below_90pct", below),
            row("pool_use_max", round(rec.pool_use_max, 3)),
            row(
                "master_rss_growth_mb",
                round(growth, 2),
                before_mb=round(faults["rss_before"] / MiB, 1),
                after_mb=round(faults["rss_after"] / MiB, 1),
            ),
            row(
                "time_to_full_replication_s",
                None if rec.full_replication_s is None else round(rec.full_replication_s, 2),
                result="reached" if rec.full_replication_s is not None else "never",
                bound_s=round(plan.write_until + plan.settle_s - plan.kill_at, 1),
            ),
            row("under_replicated_at_end", self.under_replicated_at_end),
            row(
                "segments_at_end",
                len(end.segments),
                capacity=end.capacity,
                used=end.used,
                objects=end.objects,
            ),
            row(
                "malformed_connections",
                burst.connections,
                outcomes=dict(burst.outcomes),
                seconds=round(burst.seconds, 2),
            ),
            row("master_answers_after_burst", int(bool(faults["answers_after_burst"]))),
            row(
                "idle_sockets",
                sum(flood.opened.values()),
                opened=dict(flood.opened),
                failed=dict(flood.failed),
                closed_by_server=dict(flood.closed_by_server),
                held_s=plan.flood_s,
            ),
            row("put_errors_total", sum(put_errors.values())),
            row(
                "get_errors_total",
                sum(rec.get_errors.values()),
                final=sum(self.final_get_errors.values()),
            ),
        ]
        for c, n in sorted(put_errors.items()):
            ts = [p.t for p in rec.puts if p.code == c]
            rows.append(
                row("put_errors", n, code=c, first_s=round(min(ts), 2), last_s=round(max(ts), 2))
            )
        rows += [
            row("get_errors", n, code=c, when="during") for c, n in sorted(rec.get_errors.items())
        ]
        rows += [
            row("get_errors", n, code=c, when="read-back")
            for c, n in sorted(self.final_get_errors.items())
        ]
        phases: dict[str, list[PutRecord]] = {}
        for p in rec.puts:
            phases.setdefault(self._phase_of(p.t), []).append(p)
        for phase, puts in phases.items():
            lat = [p.latency_s for p in puts if p.code == "OK"]
            rows.append(
                row(
                    "put_p99_ms",
                    round(percentile(lat, 0.99) * 1e3, 2),
                    phase=phase,
                    p50_ms=round(percentile(lat, 0.5) * 1e3, 2),
                    max_ms=round(max(p.latency_s for p in puts) * 1e3, 1),  # failed ones too
                    puts=len(puts),
                    failed=len(puts) - len(lat),
                )
            )
        return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Run the scenario (`Plan.of(quick)`) and return its rows."""
    return Scenario(Plan.of(quick)).run()


def _detail(r: dict[str, Any]) -> str:
    m = r["metric"]
    if "code" in r:
        return f"{r['code']}" + (f" ({r['when']})" if "when" in r else "")
    if "phase" in r:
        return (
            f"{r['phase']}: {r['puts']} puts, {r['failed']} failed, p50 {r['p50_ms']} ms, "
            f"max {r['max_ms']} ms"
        )
    if m == "scenario_s":
        return (
            f"3 nodes x {format_size(r['segment_size'])}, client_ttl {r['client_ttl_s']} s, "
            f"replica_num {r['replica_num']}"
        )
    if m == "acked_puts":
        return f"of {r['attempted']} attempted"
    if m == "lost_acked":
        return f"by path {r['by_path']}, by phase {r['by_phase']}"
    if m == "master_rss_growth_mb":
        return f"{r['before_mb']} -> {r['after_mb']} MB"
    if m == "time_to_full_replication_s":
        return f"{r['result']} (bound {r['bound_s']} s after the SIGKILL)"
    if m == "malformed_connections":
        return f"{r['outcomes']} in {r['seconds']} s"
    if m == "idle_sockets":
        return (
            f"opened {r['opened']}, connect failed {r['failed']}, "
            f"closed by server {r['closed_by_server']} in {r['held_s']} s"
        )
    if m == "segments_at_end":
        return (
            f"mounted (2 when node 1 remounted); {r['objects']} objects, "
            f"{format_size(r['used'])} of {format_size(r['capacity'])}"
        )
    if m == "get_errors_total":
        return f"during the run; {r['final']} at read-back"
    return ""


_COLUMNS = (
    Column("metric", "<27", lambda r: r["metric"]),
    Column("value", ">8", lambda r: "null" if r["value"] is None else str(r["value"])),
    Column(" detail", "", lambda r: f" {_detail(r)}"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    return "\n".join(line.rstrip() for line in render_table(_COLUMNS, rows).splitlines())


@click.command()
@click.option("--quick", is_flag=True, help="A small pool and a short timeline (under a minute).")
@click.option("--json", "json_path", default=None, help="Write the rows as JSON to this file.")
def command(*, quick: bool, json_path: str | None) -> None:
    """Crash, freeze and garbage on the wire against a 3-node pool; what acked writes survive."""
    rows = run(quick=quick)
    click.echo(format_table(rows))
    if json_path:
        write_json(json_path, rows)
