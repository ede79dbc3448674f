"""Mooncake's put calls: copying puts, upserts, batches, and puts from registered memory.

What differs from the native Store's puts, and why each call here exists:

* a put of an existing key answers 0 and keeps the old value (the native Store says
  OBJECT_ALREADY_EXISTS); `upsert*` overwrites;
* a copying put larger than `local_buffer_size` answers -600: Mooncake copies through a staging
  buffer of that size; kvpool writes straight from the value but keeps the limit;
* a key named twice in one batch is written once, with its first value, and both answer alike
  (the native Store refuses such batches);
* raw-pointer calls accept only ranges inside memory registered with `register_buffer`
  (memory.PointerRegistry); anything else answers -600 and is never dereferenced.
"""

from __future__ import annotations

from typing import Any

from kvpool.client import Store
from kvpool.codes import INVALID_PARAMS, OK
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import (
    answers,
    check_key,
    check_keys,
    index,
    join_parts,
    one_code,
    per_key,
    view,
)
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.errors import InvalidParams

__all__ = ["Writes"]


class Writes(StoreBase):
    """The put calls of `MooncakeDistributedStore`."""

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert `value` unless `key` exists (then 0, old value kept)."""
        return self._put(check_key(key), view(value), config, False)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Insert or overwrite."""
        return self._put(check_key(key), view(value), config, True)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """One object from several 1-D byte buffers, concatenated."""
        return self._put(check_key(key), join_parts(parts), config, False)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put(check_key(key), join_parts(parts), config, True)

    def put_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        """Put every pair; the first failure's code (partial success is possible), else 0."""
        return self._put_batch(check_keys(keys), [view(v) for v in values], config, False)

    def upsert_batch(
        self, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int:
        return self._put_batch(check_keys(keys), [view(v) for v in values], config, True)

    @answers(one_code)
    def _put_batch(
        self,
        store: Store,
        keys: list[str],
        views: list[memoryview],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> int:
        if len(keys) != len(views):
            raise InvalidParams(f"{len(keys)} keys but {len(views)} values")
        if not keys:
            return OK
        native = self._native(config)
        self._staged(sum(mv.nbytes for mv in views))
        codes = self._batch_write(store, keys, views, native, upsert=upsert, zero_copy=False)
        return next((c for c in codes if c != OK), OK)

    # ------------------------------------------------------------------ registered memory

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register `size` bytes at `buffer_ptr` for the pointer calls; 0 or -600."""
        return self._register(index(buffer_ptr), index(size))

    @answers(one_code)
    def _register(self, store: Store, ptr: int, size: int) -> int:
        reg = self._pointers.add(ptr, size)
        try:
            store.register_buffer(reg.view)
        except BaseException:
            self._pointers.remove(ptr)
            raise
        return OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Undo register_buffer (by its start address); -600 when nothing starts there."""
        return self._unregister(index(buffer_ptr))

    @answers(one_code)
    def _unregister(self, store: Store, ptr: int) -> int:
        store.unregister_buffer(self._pointers.remove(ptr).view)
        return OK

    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        """Zero-copy put of `size` registered bytes at `buffer_ptr`."""
        return self._put_from(check_key(key), index(buffer_ptr), index(size), config, False)

    def upsert_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_from(check_key(key), index(buffer_ptr), index(size), config, True)

    @answers(one_code)
    def _put_from(  # noqa: PLR0917  (positional: `answers` passes no keywords)
        self,
        store: Store,
        key: str,
        ptr: int,
        size: int,
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> int:
        mv = self._pointers.resolve(ptr, size)
        native = self._native(config)
        if upsert:
            # The native Store has no upsert_from; its upsert copies from the same memory once,
            # straight into the segment.
            store.upsert(key, mv, native)
        else:
            store.put_from(key, mv, native)
        return OK

    def put_from_with_metadata(  # noqa: PLR0917  (Mooncake's signature)
        self,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """One object: `metadata_size` bytes at `metadata_buffer_ptr`, then `size` at
        `buffer_ptr` (both registered)."""
        k = check_key(key)
        data, meta = index(buffer_ptr), index(metadata_buffer_ptr)
        return self._put_with_metadata(k, data, meta, index(size), index(metadata_size), config)

    @answers(one_code)
    def _put_with_metadata(  # noqa: PLR0917  (positional: `answers` passes no keywords)
        self,
        store: Store,
        key: str,
        data: int,
        meta: int,
        size: int,
        meta_size: int,
        config: ReplicateConfig | None,
    ) -> int:
        parts = [self._pointers.resolve(meta, meta_size), self._pointers.resolve(data, size)]
        store.put(key, b"".join(parts), self._native(config))
        return OK

    def batch_put_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Zero-copy put per key; one code per key."""
        ks = check_keys(keys)
        ptrs, ns = [index(p) for p in buffer_ptrs], [index(s) for s in sizes]
        return self._batch_put_from(ks, ptrs, ns, config, False)

    def batch_upsert_from(
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        ks = check_keys(keys)
        ptrs, ns = [index(p) for p in buffer_ptrs], [index(s) for s in sizes]
        return self._batch_put_from(ks, ptrs, ns, config, True)

    @answers(per_key)
    def _batch_put_from(  # noqa: PLR0917  (positional: `answers` passes no keywords)
        self,
        store: Store,
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        native = self._native(config)
        views = [self._pointers.find(p, n) for p, n in zip(ptrs, sizes, strict=True)]
        return self._write_resolved(store, keys, views, native, upsert=upsert)

    def batch_put_from_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """One object per key, gathered from several registered buffers."""
        ks = check_keys(keys)
        ptrs = [[index(p) for p in row] for row in all_buffer_ptrs]
        ns = [[index(s) for s in row] for row in all_sizes]
        return self._put_gathered(ks, ptrs, ns, config)

    @answers(per_key)
    def _put_gathered(
        self,
        store: Store,
        keys: list[str],
        ptrs: list[list[int]],
        sizes: list[list[int]],
        config: ReplicateConfig | None,
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        views: list[memoryview | None] = []
        for prow, nrow in zip(ptrs, sizes, strict=True):
            parts = (
                [self._pointers.find(p, n) for p, n in zip(prow, nrow, strict=True)]
                if len(prow) == len(nrow) and prow
                else [None]
            )
            ok = [p for p in parts if p is not None]
            views.append(memoryview(b"".join(ok)) if len(ok) == len(parts) else None)
        native = self._native(config)
        return self._write_resolved(store, keys, views, native, upsert=False, zero_copy=False)
