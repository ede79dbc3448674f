"""`AsyncStore`: the `Store` API as coroutines, for asyncio code.

Every method runs the thread-safe `Store` method of the same name in a small thread pool that the
AsyncStore owns, so the event loop never blocks on a round trip or a copy. This is how Mooncake's
`MooncakeDistributedStoreAsync` works too; it costs one thread hand-off per call (tens of
microseconds), and it lets several coroutines' calls overlap: the Store's RPC client pipelines
concurrent calls on one connection, and memcpy / socket I/O release the GIL.

    async with AsyncStore(master="127.0.0.1:50051") as store:
        await store.put("k", b"v")
        value = await store.get("k")

Connecting blocks (handshake, registration, maybe pre-faulting a segment), so it happens in
`open()` / `__aenter__`, in the pool, not in the constructor.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kvpool.client.config import StoreConfig
from kvpool.client.control import TaskInfo
from kvpool.client.replicate import ReplicateConfig
from kvpool.client.result import PutResult, PutStats
from kvpool.client.store import Buffer, HealthStatus, Store
from kvpool.errors import ErrorCode, InvalidParams, StoreClosed
from kvpool.protocol.drain import DrainReply
from kvpool.protocol.messages import ReplicaDesc

__all__ = ["AsyncStore"]

T = TypeVar("T")


class AsyncStore:
    """Same arguments as `Store`, plus `workers` (threads running calls, default 4);
    `AsyncStore.from_config` takes a `StoreConfig` as `Store.from_config` does."""

    def __init__(self, *args: Any, workers: int = 4, **kwargs: Any) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 1024:
            raise InvalidParams(f"workers: {workers!r} must be an int in 1..1024")
        self._factory: Callable[[], Store] = functools.partial(Store, *args, **kwargs)
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._store: Store | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: StoreConfig, *, workers: int = 4) -> AsyncStore:
        """An AsyncStore whose Store is `Store.from_config(config)` (connected by `open()`)."""
        if not isinstance(config, StoreConfig):
            raise InvalidParams(f"config: expected a StoreConfig, got {type(config).__name__}")
        store = cls(workers=workers)
        store._factory = functools.partial(Store.from_config, config)
        return store

    async def open(self) -> AsyncStore:
        """Connect (in the thread pool). Idempotent."""
        if self._closed:
            raise StoreClosed("this AsyncStore is closed")
        if self._store is None:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="kvpool-aio")
            loop = asyncio.get_running_loop()
            self._store = await loop.run_in_executor(self._executor, self._factory)
        return self

    @property
    def store(self) -> Store:
        """The underlying synchronous Store (after `open()`)."""
        if self._store is None:
            raise StoreClosed("this AsyncStore is not open (await open() or use async with)")
        return self._store

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        # Callers pass `self.store.<method>`, which already raised StoreClosed when not open.
        executor = self._executor
        if executor is None:
            raise StoreClosed("this AsyncStore is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, functools.partial(fn, *args))

    async def close(self) -> None:
        """Close the Store (unmounting its segments) and the thread pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        store, self._store = self._store, None
        executor, self._executor = self._executor, None
        if store is not None and executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, store.close)
        if executor is not None:
            executor.shutdown(wait=True)

    async def __aenter__(self) -> AsyncStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the Store's methods ------------------------------------------------------------

    async def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> bool:
        return await self._run(self.store.put, key, value, config)

    async def put_ex(
        self, key: str, value: Buffer, config: ReplicateConfig | None = None
    ) -> PutResult:
        return await self._run(self.store.put_ex, key, value, config)

    @property
    def put_stats(self) -> PutStats:
        return self.store.put_stats

    async def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> None:
        await self._run(self.store.upsert, key, value, config)

    async def put_from(
        self, key: str, buffer: Buffer, config: ReplicateConfig | None = None
    ) -> bool:
        return await self._run(self.store.put_from, key, buffer, config)

    async def flush(self) -> None:
        await self._run(self.store.flush)

    async def get(self, key: str) -> bytearray:
        return await self._run(self.store.get, key)

    async def get_into(self, key: str, buffer: Buffer) -> int:
        return await self._run(self.store.get_into, key, buffer)

    async def batch_put(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        return await self._run(self.store.batch_put, keys, values, config)

    async def batch_upsert(
        self, keys: Sequence[str], values: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        return await self._run(self.store.batch_upsert, keys, values, config)

    async def batch_put_from(
        self, keys: Sequence[str], buffers: Sequence[Buffer], config: ReplicateConfig | None = None
    ) -> list[ErrorCode]:
        return await self._run(self.store.batch_put_from, keys, buffers, config)

    async def batch_get(self, keys: Sequence[str]) -> list[bytearray | None]:
        return await self._run(self.store.batch_get, keys)

    async def batch_get_ex(self, keys: Sequence[str]) -> list[bytearray | ErrorCode]:
        return await self._run(self.store.batch_get_ex, keys)

    async def batch_get_into(self, keys: Sequence[str], buffers: Sequence[Buffer]) -> list[int]:
        return await self._run(self.store.batch_get_into, keys, buffers)

    async def exists(self, key: str) -> bool:
        return await self._run(self.store.exists, key)

    async def batch_exists(self, keys: Sequence[str]) -> list[bool]:
        return await self._run(self.store.batch_exists, keys)

    async def get_size(self, key: str) -> int:
        return await self._run(self.store.get_size, key)

    async def remove(self, key: str, force: bool = False) -> None:
        await self._run(self.store.remove, key, force)

    async def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[ErrorCode]:
        return await self._run(self.store.batch_remove, keys, force)

    async def remove_all(self, force: bool = False) -> int:
        return await self._run(self.store.remove_all, force)

    async def remove_by_regex(self, pattern: str, force: bool = False) -> int:
        return await self._run(self.store.remove_by_regex, pattern, force)

    async def register_buffer(self, buffer: Buffer | int, length: int | None = None) -> None:
        await self._run(self.store.register_buffer, buffer, length)

    async def unregister_buffer(self, buffer: Buffer | int) -> None:
        await self._run(self.store.unregister_buffer, buffer)

    async def health_check(self) -> HealthStatus:
        if self._closed:
            return HealthStatus.CLOSED
        return await self._run(self.store.health_check)

    async def create_copy_task(self, key: str, targets: Sequence[str]) -> str:
        return await self._run(self.store.create_copy_task, key, targets)

    async def create_move_task(self, key: str, source: str, target: str) -> str:
        return await self._run(self.store.create_move_task, key, source, target)

    async def query_task(self, task_id: str) -> TaskInfo:
        return await self._run(self.store.query_task, task_id)

    async def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        return await self._run(self.store.batch_replica_clear, keys, segment_name)

    async def get_replica_desc(self, key: str) -> list[ReplicaDesc]:
        return await self._run(self.store.get_replica_desc, key)

    async def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDesc]]:
        return await self._run(self.store.batch_get_replica_desc, keys)

    async def mount_segment(
        self, size: int | str, *, path: str | None = None, offset: int = 0
    ) -> str:
        return await self._run(
            functools.partial(self.store.mount_segment, path=path, offset=offset), size
        )

    async def unmount_segment(self, name: str) -> None:
        await self._run(self.store.unmount_segment, name)

    async def drain_segment(
        self, name: str, grace: float = 30.0, on_started: Callable[[], None] | None = None
    ) -> DrainReply:
        return await self._run(self.store.drain_segment, name, grace, on_started)

    async def warm_up(self) -> int:
        return await self._run(self.store.warm_up)
