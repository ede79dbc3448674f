"""Prometheus metrics of a master, read at scrape time.

Two halves. `RequestCounters` counts requests, failures, batch items and handler latency per
request kind in plain dicts of ints, updated by a wrapper around the master's RPC handler
(`RequestCounters.wrap`: one `perf_counter` pair, a few dict updates and a bisect per request;
installed only when the master serves HTTP). `MasterCollector` turns those, and what the master
already keeps (segments, index, clients, tasks, arenas, the repair queue, the reclaim engine's
`ReclaimStats`), into metric families when Prometheus scrapes: the hot path keeps no
prometheus-client objects at all (the pattern of `kvpool.cache.metrics`).

Names follow Mooncake's master where it has one (`master_total_capacity_bytes`,
`master_allocated_bytes`, `master_key_count`, `master_<op>_requests_total`,
`master_<op>_failures_total`, `master_successful_evictions_total`, ...) so that dashboards
written for it work; everything else is `kvpool_*`.
"""

from __future__ import annotations

import inspect
import re
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from kvpool.histogram import LATENCY_BUCKETS, cumulative
from kvpool.master.reclaim.adapter import MasterReclaimHooks
from kvpool.protocol.messages import Stats

if TYPE_CHECKING:
    from kvpool.master.server import MasterServer
    from kvpool.master.tiers import TierManager

__all__ = [
    "LATENCY_BUCKETS",
    "SAMPLE_EVERY",
    "KindCounters",
    "MasterCollector",
    "RequestCounters",
    "op_name",
    "reclaim_stats",
]


#: One request in this many (per kind) is timed for the latency histogram (a power of two).
SAMPLE_EVERY = 16
_SAMPLE_MASK = SAMPLE_EVERY - 1

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def op_name(kind: type[Any]) -> str:
    """`PutStart` → `put_start`, `BatchGetReplicaList` → `batch_get_replica_list`."""
    return _CAMEL.sub("_", kind.__name__).lower()


RpcHandler = Callable[[Any, Any], Any]


class KindCounters:
    """The counters of one request kind (a slotted record: one dict lookup per request)."""

    __slots__ = ("buckets", "failures", "items", "latency_sum", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.items = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0


class RequestCounters:
    """Per request kind: requests, failures (a reply code other than 0, or an exception), batch
    items (keys of requests that carry a `keys` list), and a latency histogram (bucket counts
    and a sum). One loop updates them; a scrape reads them."""

    __slots__ = ("kinds",)

    def __init__(self) -> None:
        self.kinds: dict[type[Any], KindCounters] = {}

    @property
    def requests(self) -> dict[type[Any], int]:
        return {k: c.requests for k, c in self.kinds.items()}

    def wrap(self, inner: RpcHandler) -> RpcHandler:
        """`inner`, counted. Every request is counted; one in `SAMPLE_EVERY` of each kind is
        timed for the latency histogram (two clock reads and a bisect would otherwise double
        the wrapper's cost). Measured here: about 0.2 us per request on top of a bare dispatch
        of 0.03 us, against an RPC round trip of 15 us lock-step, 3 us pipelined."""
        kinds = self.kinds
        bounds = LATENCY_BUCKETS
        clock = time.perf_counter
        struct = msgspec.Struct
        batch_kinds: set[type[Any]] = set()

        def new(kind: type[Any]) -> KindCounters:
            c = kinds[kind] = KindCounters()
            if "keys" in getattr(kind, "__struct_fields__", ()):
                batch_kinds.add(kind)
            return c

        async def later(c: KindCounters, started: float, reply: Awaitable[Any]) -> Any:
            try:
                result = await reply
            except BaseException:
                c.failures += 1
                raise
            finally:
                dt = clock() - started
                c.buckets[bisect_left(bounds, dt)] += 1
                c.latency_sum += dt
            if getattr(result, "code", 0):
                c.failures += 1
            return result

        async def failures_of(c: KindCounters, reply: Awaitable[Any]) -> Any:
            try:
                result = await reply
            except BaseException:
                c.failures += 1
                raise
            if getattr(result, "code", 0):
                c.failures += 1
            return result

        def handle(request: Any, conn: Any) -> Any:
            kind = type(request)
            c = kinds.get(kind)
            if c is None:
                c = new(kind)
            n = c.requests = c.requests + 1
            if kind in batch_kinds:
                c.items += len(request.keys)
            if n & _SAMPLE_MASK:  # not timed: most requests
                try:
                    reply = inner(request, conn)
                except BaseException:
                    c.failures += 1
                    raise
                if not isinstance(reply, struct) and inspect.isawaitable(reply):
                    return failures_of(c, reply)
                if getattr(reply, "code", 0):
                    c.failures += 1
                return reply
            started = clock()
            try:
                reply = inner(request, conn)
            except BaseException:
                c.failures += 1
                raise
            if not isinstance(reply, struct) and inspect.isawaitable(reply):
                return later(c, started, reply)
            dt = clock() - started
            c.buckets[bisect_left(bounds, dt)] += 1
            c.latency_sum += dt
            if getattr(reply, "code", 0):
                c.failures += 1
            return reply

        return handle

    def total(self, name: str) -> int:
        """Requests of the kind called `name` (`op_name`), for tests and the dashboard."""
        return sum(c.requests for k, c in self.kinds.items() if op_name(k) == name)


def _tier_counters(tiers: TierManager) -> Iterator[Any]:
    """The tier manager's counters (`kvpool_tier_<name>`) and its DFS tier's
    (`kvpool_dfs_<name>`: written, removed, abandoned, vanished, orphans)."""
    for name, n in tiers.counters.items():
        yield _counter(f"kvpool_tier_{name}", f"Tiers below memory: {name}.", n)
    if tiers.dfs is not None:
        for name, n in tiers.dfs.counters.items():
            yield _counter(f"kvpool_dfs_{name}", f"DFS tier: {name} (files).", n)


class MasterCollector(Collector):
    """The master's metric families (see the module docstring)."""

    def __init__(self, server: MasterServer, counters: RequestCounters | None) -> None:
        self._server = server
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        svc = self._server.service
        segs = svc.segments
        cap, used = segs.capacity()
        yield _gauge("master_total_capacity_bytes", "Bytes of all serving segments.", cap)
        yield _gauge("master_allocated_bytes", "Bytes allocated in serving segments.", used)
        yield _gauge("master_key_count", "Objects in the index.", len(svc.index))
        seg_cap = GaugeMetricFamily(
            "kvpool_segment_capacity_bytes", "Capacity of a mounted segment.", labels=["segment"]
        )
        seg_used = GaugeMetricFamily(
            "kvpool_segment_allocated_bytes", "Bytes allocated in a segment.", labels=["segment"]
        )
        seg_obj = GaugeMetricFamily(
            "kvpool_segment_objects", "Replicas allocated in a segment.", labels=["segment"]
        )
        seg_state = GaugeMetricFamily(
            "kvpool_segment_state",
            "1 for the segment's state (serving, silent, draining).",
            labels=["segment", "state"],
        )
        for seg in segs.mounted():
            name = [seg.name]
            seg_cap.add_metric(name, float(seg.allocator.capacity))
            seg_used.add_metric(name, float(seg.allocator.allocated))
            seg_obj.add_metric(name, float(seg.objects))
            seg_state.add_metric([seg.name, _state(seg)], 1.0)
        yield seg_cap
        yield seg_used
        yield seg_obj
        yield seg_state
        yield _gauge("kvpool_segments", "Mounted segments (silent ones included).", len(segs))
        st = svc.stats(Stats())
        yield _gauge("master_active_clients", "Clients pinging in time.", len(st.clients))
        yield _gauge(
            "kvpool_silent_clients", "Clients silent past client_ttl.", len(st.silent_clients)
        )
        yield _gauge("kvpool_in_flight_puts", "PutStarts not yet ended or revoked.", st.processing)
        yield _gauge("kvpool_arenas", "Arenas lent to clients.", st.arenas)
        yield _gauge("kvpool_arena_bytes", "Bytes held by lent arenas.", st.arena_bytes)
        yield _gauge("kvpool_tasks_active", "Replica tasks pending or processing.", st.tasks_active)
        yield _gauge(
            "kvpool_under_replicated_objects", "Objects short of replicas.", st.under_replicated
        )
        yield _gauge("kvpool_repair_in_flight", "Repair copies running.", st.repair_in_flight)
        yield _counter("kvpool_repair_done", "Repair copies that succeeded.", st.repair_done)
        yield _counter("kvpool_repair_failed", "Repair copies that failed.", st.repair_failed)
        yield _gauge("kvpool_uptime_seconds", "Seconds since the master started.", st.uptime_s)
        yield from self._reclaim(svc.hooks)
        yield from _tier_counters(svc.tiers)  # tiers (docs/parts/tiers.md)
        if self._counters is not None:
            yield from self._requests(self._counters)

    def _reclaim(self, hooks: object) -> Iterator[Any]:
        st = reclaim_stats(hooks)
        if not st:
            return
        active, inactive = st["active_records"], st["inactive_records"]
        yield _gauge("master_soft_pin_key_count", "Objects soft pinned now.", st["soft_pins"])
        yield _gauge("kvpool_reclaim_active_records", "Records on the active lists.", active)
        yield _gauge("kvpool_reclaim_inactive_records", "Records on the inactive lists.", inactive)
        yield _gauge(
            "kvpool_reclaim_resident_bytes", "Bytes tracked by reclaim.", st["resident_bytes"]
        )
        yield _gauge(
            "kvpool_reclaim_migrating_bytes", "Bytes being swapped out.", st["migrating_bytes"]
        )
        evicted = st["evicted"]
        yield _counter("master_successful_evictions", "Objects evicted.", evicted)
        yield _counter(
            "master_attempted_evictions",
            "Eviction attempts: objects evicted plus candidates kept (leased, busy, pinned).",
            evicted + st["kept_leased"] + st["kept_busy"] + st["kept_soft_pinned"],
        )
        yield _counter("master_evicted_size_bytes", "Bytes evicted.", st["evicted_bytes"])
        yield _counter("master_evicted_key_count", "Objects evicted (Mooncake's name).", evicted)
        for key, doc in (
            ("kswapd_steps", "Background reclaim (kswapd) steps."),
            ("direct_calls", "Direct reclaims (an allocation failed for room)."),
            ("direct_passes", "Direct reclaim passes."),
            ("isolated", "Records isolated in batches for eviction."),
            ("dropped", "Cache replicas dropped."),
            ("soft_pinned_evicted", "Soft-pinned objects evicted (when allowed)."),
            ("swap_outs_started", "Swap-outs (moves to another segment) started."),
            ("swap_outs_moved", "Swap-outs that moved their object."),
            ("swap_outs_failed", "Swap-outs that failed."),
            ("promoted", "Records promoted to active."),
        ):
            yield _counter(f"kvpool_reclaim_{key}", doc, st[key])

    def _requests(self, counters: RequestCounters) -> Iterator[Any]:
        kinds = sorted(counters.kinds.items(), key=lambda kv: kv[0].__name__)
        for kind, c in kinds:
            op = op_name(kind)
            yield _counter(f"master_{op}_requests", f"{kind.__name__} requests served.", c.requests)
            yield _counter(
                f"master_{op}_failures",
                f"{kind.__name__} requests answered with an error code.",
                c.failures,
            )
        req = CounterMetricFamily(
            "kvpool_master_requests", "Requests served, by kind.", labels=["op"]
        )
        fail = CounterMetricFamily(
            "kvpool_master_request_failures", "Requests that failed, by kind.", labels=["op"]
        )
        items = CounterMetricFamily(
            "kvpool_master_batch_items", "Keys carried by batch requests.", labels=["op"]
        )
        hist = HistogramMetricFamily(
            "kvpool_master_request_seconds",
            "Time the master's handler took, one request in SAMPLE_EVERY=16 of each kind "
            "(replies that wait included).",
            labels=["op"],
        )
        for kind, c in kinds:
            label = [op_name(kind)]
            req.add_metric(label, float(c.requests))
            fail.add_metric(label, float(c.failures))
            if c.items:
                items.add_metric(label, float(c.items))
            hist.add_metric(label, cumulative(LATENCY_BUCKETS, c.buckets), c.latency_sum)
        yield req
        yield fail
        yield items
        yield hist


def reclaim_stats(hooks: object) -> dict[str, int]:
    """The reclaim engine's counters and list sizes ({} without reclaim hooks)."""
    if not isinstance(hooks, MasterReclaimHooks):
        return {}
    try:
        engine = hooks.engine
    except RuntimeError:  # not attached (yet)
        return {}
    out = hooks.stats()
    out["active_records"] = sum(engine.shard(i).active_len for i in range(engine.num_shards))
    out["inactive_records"] = sum(engine.shard(i).inactive_len for i in range(engine.num_shards))
    return out


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def _state(seg: Any) -> str:
    if getattr(seg, "draining", False):
        return "draining"
    return "serving" if seg.serving else "silent"
