"""Store-side counters (`Store(..., metrics=True)`): hits, misses, bytes and latency by path.

A Store asked for metrics reads and writes through `MeteredReader` and `MeteredWriter`,
subclasses of its `Reader` and `Writer` that count each call in `StoreMetrics`: plain ints and
lists of ints, read when Prometheus scrapes (`StoreCollector`, the pattern of
`kvpool.cache.metrics` and `kvpool.ops.metrics`). A Store without metrics uses the plain
classes: it pays nothing, not even a flag test.

What is counted, per Store:

* gets: `hits` (values returned), `misses` (no readable value: not found, or still being
  written), `errors` (any other failure of a key), `get_bytes` (bytes returned);
* puts: `puts` (keys stored), `put_exists` (a put of a key that existed: nothing written),
  `put_failures` (keys refused or failed), `put_bytes` (bytes stored);
* a latency histogram per (op, path) of every call: op `get`, `get_into`, `batch_get`,
  `batch_get_into`, `put`, `batch_put`; path `shm` (the replica read first is on this host:
  a copy through shared memory), `tcp` (on another host: the transfer protocol), `disk` (a
  disk-tier replica), `hot` (the value came from the Store's hot cache, `hot_cache_size`),
  `mixed` (a batch over several), `none` (nothing was read: all missed),
  and `any` for puts (where a put's bytes go is decided inside the writer; not broken down).

Thread-safety: a Store is used from many threads; the counters are updated without a lock.
CPython's `+=` on an attribute is not atomic, so two threads finishing at the same instant may
lose one increment: counters are exact for one thread at a time (what the tests check), close
under contention, never wrong by more than the lost races. The path of a single-key read is
handed from `read` to its caller through a thread-local.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from kvpool import histogram
from kvpool.client.datapath import DataPath
from kvpool.client.hotcache import HotCache
from kvpool.client.locations import Locations, Remembered
from kvpool.client.reader import Reader
from kvpool.client.replica import order_replicas
from kvpool.client.writer import Writer
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    ObjectNotFound,
    ReplicaNotReady,
)
from kvpool.protocol.messages import LocationsReply, ReplicaDesc, ReplicaKind, ReplicaListReply
from kvpool.transfer.engine import RouteKind

if TYPE_CHECKING:
    from kvpool.client.replicate import ReplicateConfig
    from kvpool.client.store import Store

__all__ = [
    "LATENCY_BUCKETS",
    "PATHS",
    "MeteredReader",
    "MeteredWriter",
    "StoreCollector",
    "StoreMetrics",
    "metered",
    "register_store_metrics",
]

#: Upper bounds (seconds) of the latency histograms' buckets: the master's, and 5 s (a Store's
#: call may wait on the network and on other hosts).
LATENCY_BUCKETS: tuple[float, ...] = (*histogram.LATENCY_BUCKETS, 5.0)
#: The path labels of the histograms (module docstring).
PATHS: tuple[str, ...] = ("shm", "tcp", "disk", "hot", "mixed", "none", "any")
_MAX_ROUTES = 4096
_MISS = frozenset({ErrorCode.OBJECT_NOT_FOUND, ErrorCode.REPLICA_IS_NOT_READY})
_MISS_INTS = frozenset(int(c) for c in _MISS)


class _Histogram:
    """Bucket counts, a sum and a count (a slotted record: one per (op, path))."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0


class StoreMetrics:
    """The counters of one Store (module docstring); plain ints, read at scrape time."""

    __slots__ = (
        "errors",
        "get_bytes",
        "hits",
        "latency",
        "misses",
        "put_bytes",
        "put_exists",
        "put_failures",
        "puts",
    )

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.get_bytes = 0
        self.puts = 0
        self.put_exists = 0
        self.put_failures = 0
        self.put_bytes = 0
        #: (op, path) -> its latency histogram.
        self.latency: dict[tuple[str, str], _Histogram] = {}

    def observe(self, op: str, path: str, seconds: float) -> None:
        h = self.latency.get((op, path))
        if h is None:
            h = self.latency[op, path] = _Histogram()
        h.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        h.sum += seconds
        h.count += 1

    def calls(self, op: str, path: str | None = None) -> int:
        """Calls of `op` timed so far (on `path`, or on any), for tests and reports."""
        return sum(h.count for (o, p), h in self.latency.items() if o == op and path in (None, p))

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict (what `kvpool status`-like tools and tests read)."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "get_bytes": self.get_bytes,
            "puts": self.puts,
            "put_exists": self.put_exists,
            "put_failures": self.put_failures,
            "put_bytes": self.put_bytes,
            "calls": {f"{o}/{p}": h.count for (o, p), h in sorted(self.latency.items())},
        }


def _route(data: DataPath, segment: str) -> str:
    """ "shm" when the segment's bytes are copied through memory mapped here (this process's
    own, or a same-host peer's shared memory), "tcp" when they travel the transfer protocol."""
    if data.protocol == "tcp":
        return "tcp"
    try:
        return "tcp" if data.engine.route_kind(segment) is RouteKind.TCP else "shm"
    except KVPoolError:
        return "tcp"


def _adopt(cls: type[object], plain: object) -> Any:
    """A `cls` (a subclass of `type(plain)`) with every slot of `plain` copied: the metered
    form of a reader or writer the Store built, whatever its constructor takes."""
    out = object.__new__(cls)
    for klass in type(plain).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(plain, name):
                setattr(out, name, getattr(plain, name))
    state = getattr(plain, "__dict__", None)
    if state:  # (a reader or writer that grew attributes outside its slots)
        out.__dict__.update(state)
    return out


def metered(store: Store, enabled: bool) -> StoreMetrics | None:
    """With `enabled`, the Store's reader and writer replaced by their metered forms counting
    into a new `StoreMetrics` (answered); else None and nothing changes. Called once by the
    Store's setup."""
    if not enabled:
        return None
    metrics = StoreMetrics()
    store._reader = MeteredReader.adopting(store._reader, metrics)
    store._writer = MeteredWriter.adopting(store._writer, metrics)
    return metrics


class MeteredReader(Reader):
    """`Reader`, counted into `metrics` (module docstring)."""

    __slots__ = ("_routes", "_tl", "metrics")
    metrics: StoreMetrics
    _tl: threading.local
    _routes: dict[str, str]

    @classmethod
    def adopting(cls, plain: Reader, metrics: StoreMetrics) -> MeteredReader:
        out: MeteredReader = _adopt(cls, plain)
        out.metrics = metrics
        out._tl = threading.local()
        out._routes = {}
        return out

    def get(self, key: str) -> bytearray:
        t = time.perf_counter()
        self._tl.path = "none"
        try:
            out = super().get(key)
        except (ObjectNotFound, ReplicaNotReady):
            self.metrics.misses += 1
            self.metrics.observe("get", "none", time.perf_counter() - t)
            raise
        except Exception:
            self.metrics.errors += 1
            raise
        m = self.metrics
        m.hits += 1
        m.get_bytes += len(out)
        m.observe("get", self._tl.path, time.perf_counter() - t)
        return out

    def get_into(self, key: str, mv: memoryview) -> int:
        t = time.perf_counter()
        self._tl.path = "none"
        try:
            n = super().get_into(key, mv)
        except (ObjectNotFound, ReplicaNotReady):
            self.metrics.misses += 1
            self.metrics.observe("get_into", "none", time.perf_counter() - t)
            raise
        except Exception:
            self.metrics.errors += 1
            raise
        m = self.metrics
        m.hits += 1
        m.get_bytes += n
        m.observe("get_into", self._tl.path, time.perf_counter() - t)
        return n

    def read(
        self,
        key: str,
        rl: ReplicaListReply,
        dest: memoryview,
        deadline: float,
        order: list[ReplicaDesc] | None = None,
    ) -> ReplicaDesc:
        if order is None:
            order = order_replicas(rl.replicas, self._opened().is_local)
        if order:
            first = order[0]
            local_disk = first.kind == ReplicaKind.LOCAL_DISK
            self._tl.path = "disk" if local_disk else self._path(first.segment)
        return super().read(key, rl, dest, deadline, order)

    # Cached reads (`read_mode="cached"`) skip `read` and `_locations`: their path is that of
    # the remembered place, or `hot` for a value from the hot cache.

    def _hot_get(self, locations: Locations, hot: HotCache, key: str) -> bytes | None:  # type: ignore[override]
        got = Reader._hot_get(locations, hot, key)
        if got is not None:
            self._tl.path = "hot"
        return got

    def _get_remembered(self, data: DataPath, key: str, entry: Remembered) -> bytearray | None:
        self._tl.path = self._path(entry.segment)
        return super()._get_remembered(data, key, entry)

    def _read_remembered(
        self, data: DataPath, key: str, entry: Remembered, dest: memoryview
    ) -> bool:
        self._tl.path = self._path(entry.segment)
        return super()._read_remembered(data, key, entry, dest)

    def _read_remembered_batch(
        self, data: DataPath, ks: list[str], entries: list[Remembered | None]
    ) -> list[bytearray | None]:
        paths = {self._path(e.segment) for e in entries if e is not None}
        self._tl.path = paths.pop() if len(paths) == 1 else ("mixed" if paths else "none")
        return super()._read_remembered_batch(data, ks, entries)

    def _locations(self, keys: list[str]) -> LocationsReply:
        loc = super()._locations(keys)
        disk = loc.disk_segments
        segments = loc.segments
        if len(segments) == 1 and not disk:  # the common case: one segment, memory
            self._tl.path = self._path(segments[0])
            return loc
        firsts = {p[0] for code, p in zip(loc.codes, loc.places, strict=True) if code == 0 and p}
        paths = {
            "disk" if i in disk else self._path(segments[i])
            for i in firsts
            if 0 <= i < len(segments)
        }
        self._tl.path = paths.pop() if len(paths) == 1 else ("mixed" if paths else "none")
        return loc

    def _path(self, segment: str) -> str:
        """`_route` of `segment`, remembered (a segment's route is fixed while it is mounted;
        the table is emptied when it reaches `_MAX_ROUTES`)."""
        path = self._routes.get(segment)
        if path is None:
            if len(self._routes) >= _MAX_ROUTES:
                self._routes.clear()
            path = self._routes[segment] = _route(self._opened(), segment)
        return path

    def batch_get(
        self, ks: list[str], codes: list[ErrorCode] | None = None
    ) -> list[bytearray | None]:
        t = time.perf_counter()
        self._tl.path = "none"
        start = 0 if codes is None else len(codes)
        try:
            out = super().batch_get(ks, codes)
        except Exception:
            self.metrics.errors += 1  # the batch raised: its keys are not counted one by one
            raise
        m = self.metrics
        if codes is None:  # every None is a missing value: any other failure raised
            missing = out.count(None)
            m.hits += len(out) - missing
            m.misses += missing
        else:
            for code in codes[start:]:
                if code == 0:
                    m.hits += 1
                elif code in _MISS:
                    m.misses += 1
                else:
                    m.errors += 1
        m.get_bytes += sum(map(len, filter(None, out)))
        m.observe("batch_get", self._tl.path, time.perf_counter() - t)
        return out

    def batch_get_into(self, ks: list[str], views: list[memoryview]) -> list[int]:
        t = time.perf_counter()
        self._tl.path = "none"
        try:
            out = super().batch_get_into(ks, views)
        except Exception:
            self.metrics.errors += 1
            raise
        m = self.metrics
        for n in out:
            if n >= 0:
                m.hits += 1
                m.get_bytes += n
            elif n in _MISS_INTS:
                m.misses += 1
            else:
                m.errors += 1
        m.observe("batch_get_into", self._tl.path, time.perf_counter() - t)
        return out


class MeteredWriter(Writer):
    """`Writer`, counted into `metrics` (module docstring)."""

    __slots__ = ("metrics",)
    metrics: StoreMetrics

    @classmethod
    def adopting(cls, plain: Writer, metrics: StoreMetrics) -> MeteredWriter:
        out: MeteredWriter = _adopt(cls, plain)
        out.metrics = metrics
        return out

    def put_one(
        self, key: str, mv: memoryview, config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        t = time.perf_counter()
        m = self.metrics
        try:
            got = super().put_one(key, mv, config, upsert=upsert)
        except Exception:
            m.put_failures += 1
            raise
        if got > 0 or upsert:
            m.puts += 1
            m.put_bytes += mv.nbytes
        else:
            m.put_exists += 1
        m.observe("put", "any", time.perf_counter() - t)
        return got

    def put_batch(
        self,
        keys: list[str],
        views: list[memoryview],
        config: ReplicateConfig | None,
        *,
        upsert: bool,
    ) -> list[ErrorCode]:
        t = time.perf_counter()
        m = self.metrics
        try:
            codes = super().put_batch(keys, views, config, upsert=upsert)
        except Exception:
            m.put_failures += len(keys)
            raise
        for code, mv in zip(codes, views, strict=True):
            if code == ErrorCode.OK:
                m.puts += 1
                m.put_bytes += mv.nbytes
            elif code == ErrorCode.OBJECT_ALREADY_EXISTS:
                m.put_exists += 1
            else:
                m.put_failures += 1
        m.observe("batch_put", "any", time.perf_counter() - t)
        return codes


class StoreCollector(Collector):
    """kvpool_store_* metrics of one Store's `StoreMetrics`, labelled `store`."""

    def __init__(self, metrics: StoreMetrics, name: str) -> None:
        self._m = metrics
        self._name = name

    def collect(self) -> Iterator[Any]:
        m = self._m
        label = [self._name]
        for name, doc, value in (
            ("kvpool_store_get_hits", "Values a get returned.", m.hits),
            ("kvpool_store_get_misses", "Gets of keys without a readable value.", m.misses),
            ("kvpool_store_get_errors", "Keys whose get failed otherwise.", m.errors),
            ("kvpool_store_get_bytes", "Bytes gets returned.", m.get_bytes),
            ("kvpool_store_puts", "Keys stored.", m.puts),
            (
                "kvpool_store_put_exists",
                "Puts of keys that existed (nothing written).",
                m.put_exists,
            ),
            ("kvpool_store_put_failures", "Keys whose put failed.", m.put_failures),
            ("kvpool_store_put_bytes", "Bytes stored.", m.put_bytes),
        ):
            c = CounterMetricFamily(name, doc, labels=["store"])
            c.add_metric(label, float(value))
            yield c
        hist = HistogramMetricFamily(
            "kvpool_store_op_seconds",
            "Latency of the Store's calls, by op and path (shm, tcp, disk, mixed, none, any).",
            labels=["store", "op", "path"],
        )
        for (op, path), h in sorted(m.latency.items()):
            hist.add_metric(
                [self._name, op, path], histogram.cumulative(LATENCY_BUCKETS, h.buckets), h.sum
            )
        yield hist


def register_store_metrics(
    store: Store, registry: CollectorRegistry, name: str | None = None
) -> StoreCollector:
    """Export `store`'s counters (a Store made with `metrics=True`) on `registry`, labelled
    `name` (default: its client id)."""
    metrics = store.metrics
    if metrics is None:
        raise InvalidParams("this Store counts nothing: make it with Store(..., metrics=True)")
    collector = StoreCollector(metrics, name or store.client_id)
    registry.register(collector)
    return collector
