"""`fault`: a proxy that wraps any adapter and injects seeded delays and failures (for tests).

    {"type": "fault", "inner": {"type": "fs", ...}, "seed": 1, "store_failure_rate": 0.2,
     "load_failure_rate": 0.1, "lookup_miss_rate": 0.0, "max_delay_s": 0.01}

* A store picked to fail is never forwarded and reports failure (the inner store stays as it
  was, like a write that never reached the server).
* A lookup miss hides a key the inner adapter found, and releases the lock the inner adapter
  took on it (a hidden key must not stay locked).
* A load failure clears the key's bit and, with `corrupt_failed_loads` (default on), scribbles
  random bytes over its destination buffer, so tests prove that callers never hand out a buffer
  whose bit is not set.
* Every completion is held back by a random delay up to `max_delay_s`, which reorders
  completions across tasks.

The proxy has its own three eventfds and task ids, one thread that waits on the inner adapter's
eventfds and on the next due completion, and it owns (and closes) the inner adapter.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from kvpool.cache.adapters.base import (
    EventFd,
    L2Adapter,
    L2TaskId,
    StoreResult,
    check_task_args,
    drain_event_fd,
)
from kvpool.cache.adapters.registry import AdapterConfig, create_adapter, register_adapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryObj
from kvpool.errors import InvalidParams, StoreClosed
from kvpool.override import override

__all__ = ["FaultAdapterConfig", "FaultInjectingAdapter"]

logger = logging.getLogger(__name__)

_STORE, _LOOKUP, _LOAD = 0, 1, 2


@dataclass(frozen=True)
class FaultAdapterConfig(AdapterConfig):
    inner: Mapping[str, Any] = field(default_factory=lambda: {"type": "mock"})
    """The wrapped adapter's own JSON spec."""
    seed: int = 0
    """Seed of the fault and delay generator (same seed, same faults for the same calls)."""
    store_failure_rate: float = 0.0
    load_failure_rate: float = 0.0
    lookup_miss_rate: float = 0.0
    max_delay_s: float = 0.0
    corrupt_failed_loads: bool = True

    def __post_init__(self) -> None:
        for name in ("store_failure_rate", "load_failure_rate", "lookup_miss_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise InvalidParams(f"fault.{name} must be in [0, 1], got {v!r}")
        if not isinstance(self.max_delay_s, int | float) or not 0 <= self.max_delay_s <= 60:
            raise InvalidParams(f"fault.max_delay_s must be in [0, 60], got {self.max_delay_s!r}")
        if not isinstance(self.inner, Mapping) or (
            self.inner.get("type") == "fault" and not self.inner
        ):
            raise InvalidParams(f"fault.inner must be an adapter spec object, got {self.inner!r}")


class FaultInjectingAdapter(L2Adapter):
    """See the module docstring."""

    def __init__(
        self,
        inner: L2Adapter,
        *,
        seed: int = 0,
        store_failure_rate: float = 0.0,
        load_failure_rate: float = 0.0,
        lookup_miss_rate: float = 0.0,
        max_delay_s: float = 0.0,
        corrupt_failed_loads: bool = True,
    ) -> None:
        self._inner = inner
        self._rng = random.Random(seed)
        self._store_fail = store_failure_rate
        self._load_fail = load_failure_rate
        self._lookup_miss = lookup_miss_rate
        self._max_delay = max_delay_s
        self._corrupt = corrupt_failed_loads
        self._lock = threading.Lock()
        self._ids = count(1)
        self._seq = count()
        self._stores_in: dict[L2TaskId, L2TaskId] = {}  # inner id → our id
        self._lookups_in: dict[L2TaskId, tuple[L2TaskId, list[ObjectKey]]] = {}
        self._loads_in: dict[L2TaskId, tuple[L2TaskId, list[MemoryObj]]] = {}
        self._due: list[tuple[float, int, int, L2TaskId, Any]] = []
        self._stores: dict[L2TaskId, StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._fds = (EventFd(), EventFd(), EventFd())
        self._wake = EventFd()
        self._closed = False
        self.injected_store_failures = 0
        self.injected_load_failures = 0
        self.injected_lookup_misses = 0
        self._thread = threading.Thread(target=self._run, name="kvpool-l2-fault", daemon=True)
        self._thread.start()

    @property
    def inner(self) -> L2Adapter:
        return self._inner

    @override
    def get_store_event_fd(self) -> int:
        return self._fds[0].fileno()

    @override
    def get_lookup_and_lock_event_fd(self) -> int:
        return self._fds[1].fileno()

    @override
    def get_load_event_fd(self) -> int:
        return self._fds[2].fileno()

    def _new_id(self) -> L2TaskId:
        if self._closed:
            raise StoreClosed("the fault-injecting L2 adapter is closed")
        return L2TaskId(next(self._ids))

    def _schedule(self, kind: int, tid: L2TaskId, result: Any) -> None:
        """Queue a completion after a random delay; caller holds self._lock."""
        due = time.monotonic() + self._rng.uniform(0.0, self._max_delay)
        heapq.heappush(self._due, (due, next(self._seq), kind, tid, result))
        self._wake.notify()

    # -- submits (any thread) ---------------------------------------------------------------

    @override
    def submit_store_task(
        self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
    ) -> L2TaskId:
        check_task_args(keys, objects)
        with self._lock:
            tid = self._new_id()
            if self._rng.random() < self._store_fail:
                self.injected_store_failures += 1
                self._schedule(_STORE, tid, StoreResult(False, 0, "injected store failure"))
                return tid
            # Under our lock so the completion thread cannot see the inner id before the map.
            self._stores_in[self._inner.submit_store_task(keys, objects)] = tid
        return tid

    @override
    def pop_completed_store_tasks(self) -> dict[L2TaskId, StoreResult]:
        with self._lock:
            done, self._stores = self._stores, {}
        return done

    @override
    def submit_lookup_and_lock_task(self, keys: Sequence[ObjectKey]) -> L2TaskId:
        check_task_args(keys)
        with self._lock:
            tid = self._new_id()
            self._lookups_in[self._inner.submit_lookup_and_lock_task(keys)] = (tid, list(keys))
        self._wake.notify()
        return tid

    @override
    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    @override
    def submit_unlock(self, keys: Sequence[ObjectKey]) -> None:
        check_task_args(keys)
        with contextlib.suppress(StoreClosed):  # closing released every lock already
            self._inner.submit_unlock(keys)

    @override
    def submit_load_task(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> L2TaskId:
        check_task_args(keys, objects)
        with self._lock:
            tid = self._new_id()
            self._loads_in[self._inner.submit_load_task(keys, objects)] = (tid, list(objects))
        self._wake.notify()
        return tid

    @override
    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    # -- completion thread ------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        inner_fds = self._inner.event_fds()
        for fd in (*inner_fds, self._wake.fileno()):
            poller.register(fd, select.POLLIN)
        while True:
            with self._lock:
                if self._closed:
                    return
                wait_ms = 200
                if self._due:
                    wait_ms = max(
                        0, min(wait_ms, int((self._due[0][0] - time.monotonic()) * 1000) + 1)
                    )
            poller.poll(wait_ms)
            self._wake.drain()
            for fd in inner_fds:
                drain_event_fd(fd)
            try:
                self._collect()
                self._release_due()
            except Exception:
                logger.exception("fault proxy iteration failed")

    def _collect(self) -> None:
        with self._lock:
            if self._closed:
                return
            for inner_id, result in self._inner.pop_completed_store_tasks().items():
                tid = self._stores_in.pop(inner_id, None)
                if tid is not None:
                    self._schedule(_STORE, tid, result)
            for inner_id, (tid, keys) in list(self._lookups_in.items()):
                found = self._inner.query_lookup_and_lock_result(inner_id)
                if found is None:
                    continue
                del self._lookups_in[inner_id]
                hidden = [i for i in found if self._rng.random() < self._lookup_miss]
                for i in hidden:
                    found.clear(i)
                if hidden:
                    self.injected_lookup_misses += len(hidden)
                    self._inner.submit_unlock([keys[i] for i in hidden])
                self._schedule(_LOOKUP, tid, found)
            for inner_id, (tid, objs) in list(self._loads_in.items()):
                loaded = self._inner.query_load_result(inner_id)
                if loaded is None:
                    continue
                del self._loads_in[inner_id]
                for i in list(loaded):
                    if self._rng.random() < self._load_fail:
                        loaded.clear(i)
                        self.injected_load_failures += 1
                        if self._corrupt:
                            objs[i].buffer[:] = self._rng.randbytes(objs[i].size)
                self._schedule(_LOAD, tid, loaded)

    def _release_due(self) -> None:
        signal = [False, False, False]
        with self._lock:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, _, kind, tid, result = heapq.heappop(self._due)
                if kind == _STORE:
                    self._stores[tid] = result
                elif kind == _LOOKUP:
                    self._lookups[tid] = result
                else:
                    self._loads[tid] = result
                signal[kind] = True
        for kind, fire in enumerate(signal):
            if fire:
                self._fds[kind].notify()

    @override
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.notify()
        self._thread.join(timeout=30)
        self._inner.close()
        for fd in (*self._fds, self._wake):
            fd.close()


def _factory(config: FaultAdapterConfig) -> FaultInjectingAdapter:
    inner = create_adapter(config.inner)
    return FaultInjectingAdapter(
        inner,
        seed=config.seed,
        store_failure_rate=config.store_failure_rate,
        load_failure_rate=config.load_failure_rate,
        lookup_miss_rate=config.lookup_miss_rate,
        max_delay_s=config.max_delay_s,
        corrupt_failed_loads=config.corrupt_failed_loads,
    )


register_adapter("fault", FaultAdapterConfig, _factory)
