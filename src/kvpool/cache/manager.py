"""StorageManager: the one object an inference engine talks to (seed 003's entry point).

    engine ──reserve_write/finish_write (or store)──▶ L1 ──listener──▶ StoreController ─▶ L2 adapters
    engine ──submit_prefetch_task──▶ L1 prefix hits first; the rest ─▶ PrefetchController ─▶ L2
    engine ◀─query_prefetch_status / read_prefetched_results / finish_read_prefetched

Prefetch protocol (what the engine does):

    handle = sm.submit_prefetch_task(keys, layout)      # never blocks on I/O
    n = sm.query_prefetch_status(handle)                # None until done; then prefix hits
    with sm.read_prefetched_results(keys[:n]) as objs:  # objs[i] holds keys[i]'s bytes
        ...copy into the engine's KV cache...
    sm.finish_read_prefetched(keys[:n])                 # release the prefetch's read locks

The first n keys are read-locked in L1 from completion until `finish_read_prefetched`: the L1
prefix hits (taken at submit) and the L2 loads (taken atomically at the end of the load).
A request whose keys are all in L1 needs no L2 round: its handle is complete at once.
`read_prefetched_results` holds one more read lock for the duration of the `with` block, so
the objects cannot go while the engine copies, whatever else happens.

Ownership: the manager owns L1, the adapters (built from the config, or handed over), both
controllers and their threads. `close()` stops the controller threads, closes the adapters
(waiting for their in-flight I/O), then releases the controllers' remaining locks and L1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kvpool.cache.adapters.base import L2Adapter
from kvpool.cache.adapters.registry import create_adapter, parse_adapter_config
from kvpool.cache.config import StorageManagerConfig
from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Manager, L1Result, L1Status
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.cache.policy import AdapterDescriptor, create_prefetch_policy, create_store_policy
from kvpool.cache.prefetch_controller import PrefetchController, PrefetchRequest, PrefetchStats
from kvpool.cache.store_controller import StoreController, StoreStats
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, StoreClosed

__all__ = ["PrefetchHandle", "StorageManager"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PrefetchHandle:
    """What submit_prefetch_task returns: L1 prefix hits, plus the L2 request if one was needed."""

    keys: tuple[ObjectKey, ...]
    l1_hits: int
    request: PrefetchRequest | None

    @property
    def l2_needed(self) -> bool:
        return self.request is not None


class StorageManager:
    """L1 + L2 adapters + store and prefetch controllers. Thread-safe entry points."""

    def __init__(
        self,
        config: StorageManagerConfig | None = None,
        *,
        adapters: Sequence[L2Adapter] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config or StorageManagerConfig()
        self._l1 = L1Manager(self._config.l1, clock=clock)
        built: list[L2Adapter] = []
        try:
            if adapters is None:
                for spec in self._config.adapters:
                    built.append(create_adapter(spec))
                descriptors = [
                    AdapterDescriptor(i, parse_adapter_config(spec).type_name)
                    for i, spec in enumerate(self._config.adapters)
                ]
            else:
                built = list(adapters)
                descriptors = [AdapterDescriptor(i, type(a).__name__) for i, a in enumerate(built)]
            fds = [fd for a in built for fd in a.event_fds()]
            if len(set(fds)) != len(fds):
                raise InvalidParams(
                    "two L2 adapters share an eventfd; each must own three of its own"
                )
        except BaseException:
            for a in built:
                a.close()
            self._l1.close()
            raise
        self._adapters = built
        self._store = StoreController(
            self._l1,
            built,
            descriptors,
            create_store_policy(self._config.store_policy),
            max_keys_per_task=self._config.store_max_keys_per_task,
        )
        self._prefetch = PrefetchController(
            self._l1,
            built,
            descriptors,
            create_prefetch_policy(self._config.prefetch_policy),
            max_in_flight=self._config.prefetch_max_in_flight,
            lookup_timeout_s=self._config.prefetch_lookup_timeout_s,
        )
        self._closed = False
        self._store.start()
        self._prefetch.start()

    # -- parts ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def l1(self) -> L1Manager:
        return self._l1

    @property
    def adapters(self) -> list[L2Adapter]:
        return list(self._adapters)

    @property
    def store_controller(self) -> StoreController:
        return self._store

    @property
    def prefetch_controller(self) -> PrefetchController:
        return self._prefetch

    def _check(self, keys: Sequence[ObjectKey]) -> list[ObjectKey]:
        if self._closed:
            raise StoreClosed("StorageManager is closed")
        if isinstance(keys, ObjectKey | str | bytes):
            raise InvalidParams("keys must be a sequence of ObjectKey")
        out = list(keys)
        for k in out:
            if not isinstance(k, ObjectKey):
                raise InvalidParams(f"expected ObjectKey, got {type(k).__name__} {k!r}")
        return out

    # -- store path (engine → L1 → L2) ------------------------------------------------------

    def reserve_write(self, keys: Sequence[ObjectKey], layout: MemoryLayout) -> list[L1Result]:
        """Allocate write-locked L1 objects for new chunks (EXISTS for keys already cached)."""
        return self._l1.reserve_write(self._check(keys), layout)

    def finish_write(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """Publish written chunks; the store controller then replicates them to L2."""
        return self._l1.finish_write(self._check(keys))

    def abort_write(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        return self._l1.abort_write(self._check(keys))

    def store(
        self,
        keys: Sequence[ObjectKey],
        values: Sequence[bytes | bytearray | memoryview],
        layout: MemoryLayout | None = None,
    ) -> list[L1Status]:
        """Copy each value into L1 and publish it (reserve + copy + finish in one call).

        Keys already in L1 answer EXISTS and are left as they are.
        """
        keys = self._check(keys)
        if len(values) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
        if not keys:
            return []
        lay = layout or MemoryLayout.of_bytes(memoryview(values[0]).nbytes)
        res = self._l1.reserve_write(keys, lay)
        ok: list[ObjectKey] = []
        try:
            for k, v, r in zip(keys, values, res, strict=True):
                if r.status is L1Status.OK and r.obj is not None:
                    r.obj.write(v)
                    ok.append(k)
        except BaseException:
            self._l1.abort_write(
                [k for k, r in zip(keys, res, strict=True) if r.status is L1Status.OK]
            )
            raise
        self._l1.finish_write(ok)
        return [r.status for r in res]

    # -- prefetch path (L2 → L1 → engine) ---------------------------------------------------

    def submit_prefetch_task(
        self, keys: Sequence[ObjectKey], layout: MemoryLayout
    ) -> PrefetchHandle:
        """Start a prefetch; L1 answers first, L2 only for the keys after the L1 prefix."""
        keys = self._check(keys)
        if not isinstance(layout, MemoryLayout):
            raise InvalidParams(f"submit_prefetch_task needs a MemoryLayout, got {layout!r}")
        hits = len(self._l1.reserve_read_prefix(keys))
        if hits == len(keys) or not self._adapters:
            return PrefetchHandle(tuple(keys), hits, None)
        try:
            req = self._prefetch.submit(keys[hits:], layout)
        except BaseException:
            self._l1.finish_read(keys[:hits])
            raise
        return PrefetchHandle(tuple(keys), hits, req)

    def query_prefetch_status(self, handle: PrefetchHandle) -> int | None:
        """Prefix hits (L1 + L2) once the prefetch is done; None while it runs. Non-blocking."""
        if not isinstance(handle, PrefetchHandle):
            raise InvalidParams(f"expected a PrefetchHandle, got {handle!r}")
        if handle.request is None:
            return handle.l1_hits
        result = handle.request.result
        return None if result is None else handle.l1_hits + result

    def wait_prefetch(self, handle: PrefetchHandle, timeout: float = 30.0) -> int:
        """Block until the prefetch is done (for tools and tests; engines poll)."""
        if handle.request is not None and not handle.request.done.wait(timeout):
            raise KVPoolError(f"prefetch did not finish in {timeout} s", ErrorCode.RPC_TIMEOUT)
        result = self.query_prefetch_status(handle)
        assert result is not None
        return result

    @contextmanager
    def read_prefetched_results(self, keys: Sequence[ObjectKey]) -> Iterator[list[MemoryObj]]:
        """The L1 objects of prefetched keys (which must still be read-locked by the prefetch),
        pinned by one extra read lock for the duration of the block."""
        keys = self._check(keys)
        objs = self._l1.read_locked(keys)
        res = self._l1.reserve_read(keys)
        if any(r.status is not L1Status.OK for r in res):  # pragma: no cover - locked above
            self._l1.finish_read(
                [k for k, r in zip(keys, res, strict=True) if r.status is L1Status.OK]
            )
            raise InvalidParams("prefetched keys vanished from L1")
        try:
            yield objs
        finally:
            if not self._closed:
                self._l1.finish_read(keys)

    def finish_read_prefetched(self, keys: Sequence[ObjectKey]) -> list[L1Status]:
        """Release the read locks a completed prefetch holds on keys[:hits]."""
        return self._l1.finish_read(self._check(keys))

    # -- status and shutdown ----------------------------------------------------------------

    def store_stats(self) -> StoreStats:
        return self._store.stats()

    def prefetch_stats(self) -> PrefetchStats:
        return self._prefetch.stats()

    def wait_stores(self, timeout: float = 30.0) -> bool:
        """True once every finished write has been stored to L2 (or failed)."""
        return self._store.wait_idle(timeout)

    def close(self) -> None:
        """Stop both controllers, close every adapter, release all locks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._store.stop()
        self._prefetch.stop()
        for a in self._adapters:
            try:
                a.close()
            except Exception:
                logger.exception("closing an L2 adapter failed")
        self._store.close()
        self._prefetch.close()
        self._l1.close()

    def __enter__(self) -> StorageManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
