"""PrefetchController: bring the longest loadable prefix of a request's keys from L2 into L1.

One thread runs every request through a small state machine (seed 003 "Prefetch flow"):

    QUEUED ─(fewer than max_in_flight running)─▶ LOOKUP
      submit_lookup_and_lock_task on EVERY adapter; wait for all of them
    LOOKUP ─▶ LOAD
      1. PrefetchPolicy.select_load_plan → validated (disjoint, within the lookups)
      2. prefix = keys planned or already READY in L1, up to the first key neither has:
         keys after the first gap are not loaded; L1's own keys are read-locked, not loaded
      3. L1.reserve_write(planned keys in the prefix, temporary=True); re-trim at the first
         key L1 refused (a key that became resident meanwhile is read-locked instead)
      4. phase-1 unlock: keys found and locked in L2 that the plan does not use
      5. submit_load_task per adapter into the reserved L1 objects; wait for all
    LOAD ─▶ DONE
      6. phase-2 unlock: every planned key
      7. prefix of loaded-or-L1 keys → L1.finish_write_and_reserve_read (atomic write→read)
      8. the rest of the reservations → L1.abort_write, L1 read locks beyond it released
      9. request.result = prefix hits (the caller's L1 read locks are on exactly those keys)

A failed or short load only shortens the prefix: objects whose bit is not set are discarded,
never shown to the engine. Every L2 lock taken by a lookup is released exactly once (phase 1 or
phase 2, or by `release_in_flight` at shutdown), which the controller tests check against the
mock adapter's lock table.

Lookups have a deadline (`lookup_timeout_s` after they were submitted). A request stops waiting
for a lookup that has not answered by then and plans as if that adapter found nothing. The
lookup becomes an *orphan*, as do the lookups of a request abandoned in LOOKUP: it is still
polled, so that whatever it locks when it answers late is unlocked, but only for another
`lookup_timeout_s`; an orphan that never answers is then dropped (counted in
`PrefetchStats.orphans_dropped`), not polled forever.

Only this thread calls the adapters' lookup/load/unlock methods and the request state; callers
talk to it through `submit` (a queue and an eventfd) and `PrefetchRequest.done`.
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from itertools import count

from kvpool.cache.adapters.base import EventFd, L2Adapter, L2TaskId, drain_event_fd
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Manager, L1Status
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.cache.policy import (
    AdapterDescriptor,
    DefaultPrefetchPolicy,
    PrefetchPolicy,
    validate_load_plan,
)
from kvpool.errors import InvalidParams, StoreClosed

__all__ = ["PrefetchController", "PrefetchRequest", "PrefetchStats", "RequestPhase"]

logger = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 500
DEFAULT_MAX_IN_FLIGHT = 8
DEFAULT_LOOKUP_TIMEOUT_S = 30.0


class RequestPhase(Enum):
    QUEUED = "queued"
    LOOKUP = "lookup"
    LOAD = "load"
    DONE = "done"


class PrefetchRequest:
    """One prefetch; `result` (prefix hits) is set once, then `done` is set."""

    __slots__ = (
        "done",
        "id",
        "keys",
        "l1_bits",
        "layout",
        "load_results",
        "load_tasks",
        "lookup_deadline",
        "lookup_results",
        "lookup_tasks",
        "objs",
        "phase",
        "plan",
        "prefix",
        "result",
    )

    def __init__(self, request_id: int, keys: list[ObjectKey], layout: MemoryLayout) -> None:
        self.id = request_id
        self.keys = keys
        self.layout = layout
        self.phase = RequestPhase.QUEUED
        self.lookup_tasks: dict[int, L2TaskId] = {}
        self.lookup_deadline = math.inf  # set when the lookups are submitted
        self.lookup_results: dict[int, Bitmap] = {}
        self.plan: dict[int, Bitmap] = {}
        self.load_tasks: dict[int, L2TaskId] = {}
        self.load_results: dict[int, Bitmap] = {}
        self.objs: dict[int, MemoryObj] = {}  # request position → temporary L1 object to load into
        self.l1_bits = Bitmap(len(keys))  # positions served from L1 (read-locked at plan time)
        self.prefix = 0
        self.result: int | None = None
        self.done = threading.Event()


@dataclass(slots=True)
class PrefetchStats:
    requests: int = 0
    completed: int = 0
    keys_requested: int = 0
    keys_found: int = 0  # in some adapter's lookup
    keys_planned: int = 0  # after trimming to the prefix and reserving L1
    keys_loaded: int = 0  # in the final prefix
    load_failures: int = 0  # planned keys that did not load
    l1_refusals: int = 0  # prefix cut because L1 could not reserve a key
    plan_errors: int = 0
    max_in_flight_seen: int = 0
    lookup_timeouts: int = 0  # lookups a running request stopped waiting for (orphaned)
    orphans_dropped: int = 0  # orphaned lookups that never answered, dropped at their deadline


@dataclass(slots=True)
class _Orphan:
    """A lookup nobody waits for any more: polled until `deadline` only to unlock what it
    locks when it answers."""

    adapter: int
    task: L2TaskId
    keys: list[ObjectKey]
    deadline: float


class PrefetchController:
    """Owns one thread, a request eventfd and a stop eventfd; see the module docstring."""

    def __init__(
        self,
        l1: L1Manager,
        adapters: Sequence[L2Adapter],
        descriptors: Sequence[AdapterDescriptor],
        policy: PrefetchPolicy,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        lookup_timeout_s: float = DEFAULT_LOOKUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`lookup_timeout_s`: how long a request waits for a lookup, and how long an orphaned
        lookup is still polled after that (see the module docstring)."""
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or max_in_flight < 1
        ):
            raise InvalidParams(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if (
            isinstance(lookup_timeout_s, bool)
            or not isinstance(lookup_timeout_s, int | float)
            or not 0 < lookup_timeout_s < math.inf
        ):
            raise InvalidParams(
                f"lookup_timeout_s must be a finite number of seconds > 0, got {lookup_timeout_s!r}"
            )
        self._lookup_timeout = float(lookup_timeout_s)
        self._clock = clock
        self._l1 = l1
        self._adapters = list(adapters)
        self._descriptors = list(descriptors)
        self._policy = policy
        self._max_in_flight = max_in_flight
        self._lock = threading.Lock()
        self._pending: deque[PrefetchRequest] = deque()
        self._running: dict[int, PrefetchRequest] = {}
        self._ids = count(1)
        self._wake = EventFd()
        self._stop = EventFd()
        self._stats = PrefetchStats()
        self._orphans: list[_Orphan] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="kvpool-prefetch-controller", daemon=True
            )
            self._thread.start()

    # -- callers ----------------------------------------------------------------------------

    def submit(self, keys: Sequence[ObjectKey], layout: MemoryLayout) -> PrefetchRequest:
        """Queue a prefetch of `keys` (all of one layout); returns at once."""
        with self._lock:
            if self._closed:
                raise StoreClosed("the prefetch controller is closed")
            req = PrefetchRequest(next(self._ids), list(keys), layout)
            self._pending.append(req)
            self._stats.requests += 1
            self._stats.keys_requested += len(req.keys)
        self._wake.notify()
        return req

    def stats(self) -> PrefetchStats:
        with self._lock:
            return replace(self._stats)

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def queued(self) -> int:
        with self._lock:
            return len(self._pending)

    def orphans(self) -> int:
        """Orphaned lookups still polled (read without the thread's cooperation: a hint)."""
        return len(self._orphans)

    # -- thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        adapter_fds: set[int] = set()
        for a in self._adapters:
            for fd in (a.get_lookup_and_lock_event_fd(), a.get_load_event_fd()):
                adapter_fds.add(fd)
                poller.register(fd, select.POLLIN)
        poller.register(self._wake.fileno(), select.POLLIN)
        poller.register(self._stop.fileno(), select.POLLIN)
        while True:
            events = poller.poll(POLL_TIMEOUT_MS)
            if self._stop.drain():
                return
            self._wake.drain()
            for fd, _ in events:
                if fd in adapter_fds:
                    drain_event_fd(fd)
            try:
                self._step()
            except Exception:  # the thread must survive a bad request; it fails alone
                logger.exception("prefetch controller iteration failed")

    def _step(self) -> None:
        """Admit queued requests and advance every running one as far as results allow."""
        if self._orphans:
            self._reap_orphans()
        self._admit()
        for req in list(self._running.values()):
            self._advance(req)
        if self._pending and len(self._running) < self._max_in_flight:
            self._wake.notify()  # requests finished this step; admit more on the next one

    def _admit(self) -> None:
        while True:
            with self._lock:
                if not self._pending or len(self._running) >= self._max_in_flight:
                    return
                req = self._pending.popleft()
                self._running[req.id] = req
                self._stats.max_in_flight_seen = max(
                    self._stats.max_in_flight_seen, len(self._running)
                )
            req.phase = RequestPhase.LOOKUP
            req.lookup_deadline = self._clock() + self._lookup_timeout
            n = len(req.keys)
            for idx, a in enumerate(self._adapters):
                try:
                    req.lookup_tasks[idx] = a.submit_lookup_and_lock_task(req.keys)
                except Exception as exc:
                    logger.warning("lookup submit to adapter %d failed: %s", idx, exc)
                    req.lookup_results[idx] = Bitmap(n)
            self._advance(req)

    def _advance(self, req: PrefetchRequest) -> None:
        """Move one request on as far as results allow; a fault fails this request alone."""
        try:
            if req.phase is RequestPhase.LOOKUP:
                self._poll_lookups(req)
            if req.phase is RequestPhase.LOAD:
                self._poll_loads(req)
        except Exception:
            logger.exception("prefetch request %d failed; answering 0 hits", req.id)
            self._abandon(req)

    def _poll_lookups(self, req: PrefetchRequest) -> None:
        for idx, tid in list(req.lookup_tasks.items()):
            bm = self._adapters[idx].query_lookup_and_lock_result(tid)
            if bm is not None:
                del req.lookup_tasks[idx]
                req.lookup_results[idx] = bm if bm.size == len(req.keys) else Bitmap(len(req.keys))
        if req.lookup_tasks:
            now = self._clock()
            if now < req.lookup_deadline:
                return
            # Late: plan without them (as if they found nothing); they become orphans, so
            # that what they lock if they answer after all is unlocked.
            for idx, tid in req.lookup_tasks.items():
                logger.warning(
                    "prefetch request %d: adapter %d did not answer its lookup in %.1f s",
                    req.id,
                    idx,
                    self._lookup_timeout,
                )
                req.lookup_results[idx] = Bitmap(len(req.keys))
                self._orphans.append(_Orphan(idx, tid, req.keys, now + self._lookup_timeout))
            with self._lock:
                self._stats.lookup_timeouts += len(req.lookup_tasks)
            req.lookup_tasks.clear()
        self._plan_and_load(req)

    def _plan_and_load(self, req: PrefetchRequest) -> None:
        n = len(req.keys)
        found = Bitmap(n)
        for bm in req.lookup_results.values():
            found = found | bm
        try:
            plan = self._policy.select_load_plan(req.keys, req.lookup_results, self._descriptors)
            validate_load_plan(plan, req.lookup_results, n)
        except Exception as exc:
            logger.error("prefetch policy gave a bad plan (%s); using the default policy", exc)
            with self._lock:
                self._stats.plan_errors += 1
            plan = DefaultPrefetchPolicy().select_load_plan(
                req.keys, req.lookup_results, self._descriptors
            )
        planned = Bitmap(n)
        for bm in plan.values():
            planned = planned | bm

        # The prefix runs through keys some adapter will load and keys L1 holds already (written
        # by the engine, or stored there since the manager's L1 check): a key in L1 past a gap
        # that L2 fills must not cut the prefix, nor be loaded again.
        ready = self._l1.readable(req.keys)
        p = 0
        while p < n and (planned.test(p) or ready[p]):
            p += 1
        load_idx = planned.prefix(p).indices()
        from_l1 = [i for i in range(p) if not planned.test(i)]

        # Temporary L1 objects for the loads, read locks for the L1 keys. A planned key that
        # became resident meanwhile (EXISTS) is read from L1 instead; any other refusal (L1
        # full, the key being written by someone else) cuts the prefix there.
        res_w = (
            self._l1.reserve_write([req.keys[i] for i in load_idx], req.layout, temporary=True)
            if load_idx
            else []
        )
        objs = {
            i: r.obj
            for i, r in zip(load_idx, res_w, strict=True)
            if r.status is L1Status.OK and r.obj is not None
        }
        exists = [i for i, r in zip(load_idx, res_w, strict=True) if r.status is L1Status.EXISTS]
        readers = sorted(from_l1 + exists)
        res_r = self._l1.reserve_read([req.keys[i] for i in readers]) if readers else []
        l1_ok = {i for i, r in zip(readers, res_r, strict=True) if r.status is L1Status.OK}
        q = next((i for i in range(p) if i not in objs and i not in l1_ok), p)
        if q < p:
            with self._lock:
                self._stats.l1_refusals += 1
        late_w = [req.keys[i] for i in objs if i >= q]
        late_r = [req.keys[i] for i in l1_ok if i >= q]
        if late_w:
            self._l1.abort_write(late_w)
        if late_r:
            self._l1.finish_read(late_r)
        req.objs = {i: o for i, o in objs.items() if i < q}
        req.l1_bits = Bitmap.from_indices(n, [i for i in l1_ok if i < q])
        plan = {
            idx: Bitmap.from_indices(n, [i for i in bm if i in req.objs])
            for idx, bm in plan.items()
        }
        plan = {idx: bm for idx, bm in plan.items() if bm.any()}
        req.prefix = q
        req.plan = plan

        # Phase-1 unlock: what each adapter found and locked but will not load.
        for idx, bm in req.lookup_results.items():
            unused = bm.without(plan.get(idx, Bitmap(n)))
            if unused.any():
                self._unlock(idx, unused.gather(req.keys))
        with self._lock:
            self._stats.keys_found += found.popcount()
            self._stats.keys_planned += len(req.objs)

        req.phase = RequestPhase.LOAD
        for idx, bm in plan.items():
            idxs = bm.indices()
            try:
                req.load_tasks[idx] = self._adapters[idx].submit_load_task(
                    [req.keys[i] for i in idxs], [req.objs[i] for i in idxs]
                )
            except Exception as exc:
                logger.warning("load submit to adapter %d failed: %s", idx, exc)
                req.load_results[idx] = Bitmap(len(idxs))

    def _poll_loads(self, req: PrefetchRequest) -> None:
        for idx, tid in list(req.load_tasks.items()):
            bm = self._adapters[idx].query_load_result(tid)
            if bm is not None:
                del req.load_tasks[idx]
                req.load_results[idx] = bm
        if not req.load_tasks:
            self._finalize(req)

    def _finalize(self, req: PrefetchRequest) -> None:
        n = len(req.keys)
        # Phase-2 unlock: every key the plan used, loaded or not.
        loaded = Bitmap(n)
        for idx, bm in req.plan.items():
            idxs = bm.indices()
            self._unlock(idx, [req.keys[i] for i in idxs])
            sub = req.load_results.get(idx, Bitmap(len(idxs)))
            # Map the adapter's per-task bitmap back to request positions; ignore any bit an
            # adapter reports outside its task.
            for j, i in enumerate(idxs):
                if j < sub.size and sub.test(j):
                    loaded.set(i)
        q = (loaded | req.l1_bits).prefix(req.prefix).count_leading_ones()
        admit = [i for i in range(q) if i in req.objs]
        res = self._l1.finish_write_and_reserve_read([req.keys[i] for i in admit]) if admit else []
        bad = next((i for i, r in zip(admit, res, strict=True) if r.status is not L1Status.OK), q)
        if bad < q:
            # A reservation expired under us: its bytes are not trusted, and the prefix ends
            # there. Release what was read-locked beyond it.
            self._l1.finish_read(
                [
                    req.keys[i]
                    for i, r in zip(admit, res, strict=True)
                    if i > bad and r.status is L1Status.OK
                ]
            )
            q = bad
        admitted = set(admit)
        self._l1.abort_write([req.keys[i] for i in req.objs if i not in admitted])
        beyond = [req.keys[i] for i in req.l1_bits if i >= q]
        if beyond:
            self._l1.finish_read(beyond)
        with self._lock:
            self._stats.keys_loaded += sum(1 for i in req.objs if i < q)
            self._stats.load_failures += sum(1 for i in req.objs if not loaded.test(i))
        self._complete(req, q)

    def _unlock(self, idx: int, keys: list[ObjectKey]) -> None:
        if not keys:
            return
        try:
            self._adapters[idx].submit_unlock(keys)
        except Exception as exc:  # the adapter promises eventual success; log and move on
            logger.error("unlock of %d keys on adapter %d raised: %s", len(keys), idx, exc)

    def _complete(self, req: PrefetchRequest, hits: int) -> None:
        req.phase = RequestPhase.DONE
        req.result = hits
        # The engine may keep the handle for long; it must not keep the buffers alive (L1
        # reuses a dropped object's memory only once nothing references it).
        req.objs = {}
        with self._lock:
            self._running.pop(req.id, None)
            self._stats.completed += 1
        req.done.set()

    def _abandon(self, req: PrefetchRequest) -> None:
        """Release everything a request holds and answer 0 hits (shutdown, internal error)."""
        n = len(req.keys)
        if req.phase is RequestPhase.LOOKUP:
            for idx, bm in req.lookup_results.items():
                if bm.any():
                    self._unlock(idx, bm.gather(req.keys))
            # Lookups still in flight lock what they find when they finish: keep polling them
            # (for a while) and release it then (at shutdown, closing the adapter releases
            # them instead).
            deadline = self._clock() + self._lookup_timeout
            for idx, tid in req.lookup_tasks.items():
                self._orphans.append(_Orphan(idx, tid, req.keys, deadline))
            req.lookup_tasks.clear()
        elif req.phase is RequestPhase.LOAD:
            for idx, bm in req.plan.items():
                self._unlock(idx, bm.gather(req.keys) if bm.size == n else [])
        # L1 holdings exist only once a plan was made; release them in either phase.
        if req.objs:
            self._l1.abort_write([req.keys[i] for i in req.objs])
        if req.l1_bits.any():
            self._l1.finish_read(req.l1_bits.gather(req.keys))
        self._complete(req, 0)

    def _reap_orphans(self) -> None:
        """Unlock what late lookups locked; drop those that are past their deadline."""
        still: list[_Orphan] = []
        now = self._clock()
        dropped = 0
        for orphan in self._orphans:
            idx = orphan.adapter
            try:
                found = self._adapters[idx].query_lookup_and_lock_result(orphan.task)
            except Exception as exc:  # a broken adapter must not block the other orphans
                logger.warning("dropping a late lookup on adapter %d: %s", idx, exc)
                continue
            if found is None:
                if now < orphan.deadline:
                    still.append(orphan)
                else:
                    # Never answered: whatever it may lock later is the adapter's to release
                    # (on close); polling it forever would cost every step of this thread.
                    logger.warning("dropping a lookup on adapter %d that never answered", idx)
                    dropped += 1
            elif found.any() and found.size == len(orphan.keys):
                self._unlock(idx, found.gather(orphan.keys))
        self._orphans = still
        if dropped:
            with self._lock:
                self._stats.orphans_dropped += dropped

    # -- shutdown ---------------------------------------------------------------------------

    def stop(self) -> None:
        with self._lock:
            self._closed = True
        self._stop.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():  # pragma: no cover
                logger.error("prefetch controller thread did not stop")
            self._thread = None

    def release_in_flight(self) -> None:
        """Answer every queued and running request with 0 hits, releasing its locks."""
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
        for req in pending:
            self._complete(req, 0)
        for req in list(self._running.values()):
            try:
                self._abandon(req)
            except StoreClosed:
                self._complete(req, 0)

    def close(self) -> None:
        if self._wake.closed:
            return
        self.stop()
        self.release_in_flight()
        self._orphans.clear()  # the adapters' close releases what late lookups locked
        self._wake.close()
        self._stop.close()
