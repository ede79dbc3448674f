"""StoreController: replicate chunks the engine finished writing into L1 to the L2 adapters.

    L1.finish_write ─▶ StoreListener (inside the L1 lock: append + eventfd write, nothing else)
    controller thread (poll on: listener fd, every adapter's store fd, stop fd)
      ─▶ group new keys by (model_name, kv_rank)     one batch has one shape and dtype
      ─▶ StorePolicy.select_store_targets            adapter index → keys
      ─▶ L1.reserve_read                              the bytes cannot change or go meanwhile
      ─▶ adapter.submit_store_task                    tasks of at most max_keys_per_task keys
      ─▶ (store fd) pop_completed_store_tasks ─▶ L1.finish_read ─▶ StorePolicy.select_l1_deletions

Store is best-effort (seed 003): a failed task is logged and counted, never retried, and the L1
copy is kept (only a successful store may lead to an L1 deletion, and only if the policy asks).
Keys evicted from L1 before the controller got to them are skipped. Only this thread calls the
adapters' store methods, so task ids need no lock; `stats()` may be read from any thread.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvpool.cache.adapters.base import EventFd, L2Adapter, L2TaskId, drain_event_fd
from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Listener, L1Manager, L1Status
from kvpool.cache.policy import AdapterDescriptor, StorePolicy
from kvpool.errors import InvalidParams

__all__ = ["StoreController", "StoreListener", "StoreStats"]

logger = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 500


@dataclass(slots=True)
class StoreStats:
    submitted_tasks: int = 0
    stored_tasks: int = 0
    stored_keys: int = 0
    stored_bytes: int = 0
    failed_tasks: int = 0
    failed_keys: int = 0
    submit_errors: int = 0
    skipped_keys: int = 0  # gone from L1 before they could be read-locked
    l1_deletions: int = 0
    per_adapter_failures: dict[int, int] = field(default_factory=dict)


class StoreListener(L1Listener):
    """Runs inside the L1 lock: only appends keys and writes an eventfd (never calls L1)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: list[ObjectKey] = []
        self.event = EventFd()

    def on_keys_write_finished(self, keys: list[ObjectKey]) -> None:
        with self._lock:
            self._keys.extend(keys)
        self.event.notify()

    def take(self) -> list[ObjectKey]:
        self.event.drain()
        with self._lock:
            keys, self._keys = self._keys, []
        return keys


class StoreController:
    """Owns one thread, the listener and its eventfd; see the module docstring."""

    def __init__(
        self,
        l1: L1Manager,
        adapters: Sequence[L2Adapter],
        descriptors: Sequence[AdapterDescriptor],
        policy: StorePolicy,
        *,
        max_keys_per_task: int = 16,
    ) -> None:
        if (
            isinstance(max_keys_per_task, bool)
            or not isinstance(max_keys_per_task, int)
            or max_keys_per_task < 1
        ):
            raise InvalidParams(f"max_keys_per_task must be an int >= 1, got {max_keys_per_task!r}")
        self._max_keys = max_keys_per_task
        self._l1 = l1
        self._adapters = list(adapters)
        self._descriptors = list(descriptors)
        self._policy = policy
        self._listener = StoreListener()
        self._stop = EventFd()
        self._in_flight: dict[tuple[int, L2TaskId], list[ObjectKey]] = {}
        self._stats = StoreStats()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closed = False
        l1.register_listener(self._listener)

    def start(self) -> None:
        if self._thread is None and self._adapters:
            self._thread = threading.Thread(
                target=self._run, name="kvpool-store-controller", daemon=True
            )
            self._thread.start()

    # -- thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        fd_to_adapter: dict[int, int] = {}
        for i, a in enumerate(self._adapters):
            fd = a.get_store_event_fd()
            fd_to_adapter[fd] = i
            poller.register(fd, select.POLLIN)
        poller.register(self._listener.event.fileno(), select.POLLIN)
        poller.register(self._stop.fileno(), select.POLLIN)
        while True:
            events = poller.poll(POLL_TIMEOUT_MS)
            if self._stop.drain():
                return
            with self._cond:
                self._busy = True
            try:
                for fd, _ in events:
                    if fd in fd_to_adapter:
                        drain_event_fd(fd)
                self._process_new_keys(self._listener.take())
                # One signal may cover several tasks, and popping is cheap: collect every
                # adapter's completions on each wake-up (also after a timeout).
                for idx in range(len(self._adapters)):
                    try:
                        self._process_completions(idx)
                    except Exception:  # one broken adapter must not starve the others
                        logger.exception("collecting store completions of adapter %d failed", idx)
            except Exception:  # the thread must survive any single bad batch
                logger.exception("store controller iteration failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _process_new_keys(self, keys: list[ObjectKey]) -> None:
        if not keys:
            return
        groups: dict[tuple[str, int], list[ObjectKey]] = {}
        for k in keys:
            groups.setdefault(k.group, []).append(k)
        for group_keys in groups.values():
            targets = self._policy.select_store_targets(group_keys, self._descriptors)
            for idx, all_keys in targets.items():
                if not 0 <= idx < len(self._adapters):
                    continue
                # Bounded tasks: a long prompt's hundreds of chunks become several tasks that an
                # adapter's workers run in parallel, instead of one task on one worker.
                for start in range(0, len(all_keys), self._max_keys):
                    self._submit(idx, all_keys[start : start + self._max_keys])

    def _submit(self, idx: int, tkeys: list[ObjectKey]) -> None:
        res = self._l1.reserve_read(tkeys)
        ok_keys = [k for k, r in zip(tkeys, res, strict=True) if r.status is L1Status.OK]
        objs = [r.obj for r in res if r.status is L1Status.OK and r.obj is not None]
        self._stats.skipped_keys += len(tkeys) - len(ok_keys)
        if not ok_keys:
            return
        try:
            tid = self._adapters[idx].submit_store_task(ok_keys, objs)
        except Exception as exc:
            # Failure must not leak the read locks just taken.
            self._l1.finish_read(ok_keys)
            self._stats.submit_errors += 1
            logger.warning("store submit to adapter %d failed: %s", idx, exc)
            return
        self._in_flight[(idx, tid)] = ok_keys
        self._stats.submitted_tasks += 1

    def _process_completions(self, idx: int) -> None:
        done = self._adapters[idx].pop_completed_store_tasks()
        for tid, result in done.items():
            keys = self._in_flight.pop((idx, tid), None)
            if keys is None:
                continue  # not ours (someone else drove this adapter)
            self._l1.finish_read(keys)
            if result.ok:
                self._stats.stored_tasks += 1
                self._stats.stored_keys += len(keys)
                self._stats.stored_bytes += result.bytes_written
                deletions = self._policy.select_l1_deletions(keys)
                if deletions:
                    st = self._l1.delete(deletions)
                    self._stats.l1_deletions += st.count(L1Status.OK)
            else:
                self._stats.failed_tasks += 1
                self._stats.failed_keys += len(keys)
                self._stats.per_adapter_failures[idx] = (
                    self._stats.per_adapter_failures.get(idx, 0) + 1
                )
                logger.warning(
                    "store of %d keys to adapter %d failed (kept in L1, not retried): %s",
                    len(keys),
                    idx,
                    result.error,
                )

    # -- owner's API ------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._cond:
            return replace(self._stats, per_adapter_failures=dict(self._stats.per_adapter_failures))

    def in_flight(self) -> int:
        with self._cond:
            return len(self._in_flight)

    def wait_idle(self, timeout: float) -> bool:
        """True once no new keys are queued and no store task is in flight (for tests, tools)."""

        def idle() -> bool:
            with self._listener._lock:
                queued = bool(self._listener._keys)
            return not self._busy and not queued and not self._in_flight

        with self._cond:
            return self._cond.wait_for(idle, timeout)

    def stop(self) -> None:
        """Stop the thread (in-flight tasks keep their read locks until release_in_flight)."""
        self._stop.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():  # pragma: no cover - would be a bug in the loop
                logger.error("store controller thread did not stop")
            self._thread = None

    def release_in_flight(self) -> None:
        """Release the read locks of tasks that never completed (after the adapters closed)."""
        for keys in self._in_flight.values():
            self._l1.finish_read(keys)
        self._in_flight.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop()
        self.release_in_flight()
        self._l1.unregister_listener(self._listener)
        self._listener.event.close()
        self._stop.close()
