"""`StoreBase`: the state of one `MooncakeDistributedStore` and the writes and reads its calls share.

`MooncakeDistributedStore` (store.py) is assembled from one class per family of Mooncake calls
(writes.py, reads.py, replicas.py, sessions.py, segments.py, tensor.py); each stands on this
base: the native `kvpool.client.Store` once set up (None before `setup()` and after `close()`),
the registered memory the pointer calls may touch, the local buffer's size and read side, and
the few helpers more than one family calls. Method bodies that need the native Store are
wrapped by `calls.answers`, which answers for a store that is not set up and for faults.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from kvpool.client import Store
from kvpool.codes import INVALID_PARAMS, OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND, OK
from kvpool.compat.mooncake import names
from kvpool.compat.mooncake.calls import answers, one_code
from kvpool.compat.mooncake.memory import PointerRegistry
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.errors import InvalidParams

__all__ = ["StoreBase"]

T = TypeVar("T")

_DEFAULT_CONFIG = ReplicateConfig()


class StoreBase:
    """What every family of calls of `MooncakeDistributedStore` stands on (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._hostname = ""
        self._buffer_size = 0
        self._pointers = PointerRegistry()
        # The read side of Mooncake's local buffer: `get` reads into it and copies out once.
        # Reading into fresh memory instead (the native Store's `get`) and then copying into
        # the `bytes` Mooncake returns touches two fresh allocations per call, and first-touch
        # page faults make a large `get` several times slower (docs/performance.md).
        # Allocated untouched (numpy.empty): pages are faulted in by the first reads that need
        # them, then stay warm.
        self._staging: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._staging_lock = threading.Lock()

    # ------------------------------------------------------------------ writes

    def _native(self, config: ReplicateConfig | None) -> Any:
        """The native config of a Mooncake one (None: the default); TypeError for another type."""
        cfg = _DEFAULT_CONFIG if config is None else config
        if not isinstance(cfg, ReplicateConfig):
            raise TypeError(f"config: expected a ReplicateConfig, got {type(cfg).__name__}")
        return cfg.to_native(names.pool_names)

    def _staged(self, nbytes: int) -> None:
        if nbytes > self._buffer_size:
            raise InvalidParams(
                f"{nbytes} bytes do not fit the local buffer of {self._buffer_size} bytes "
                "(Mooncake's staging limit, kept for compatibility)"
            )

    @answers(one_code)
    def _put(
        self,
        store: Store,
        key: str,
        mv: memoryview,
        config: ReplicateConfig | None,
        upsert: bool,
    ) -> int:
        """A copying put (or upsert) of one value: 0 also when the key exists (old value kept)."""
        native = self._native(config)
        self._staged(mv.nbytes)
        if upsert:
            store.upsert(key, mv, native)
        else:
            store.put(key, mv, native)
        return OK

    @staticmethod
    def _batch_write(
        store: Store,
        keys: list[str],
        views: list[memoryview],
        native: Any,
        *,
        upsert: bool,
        zero_copy: bool,
    ) -> list[int]:
        """Write a batch through the Store; one Mooncake code per key (exists → 0)."""
        order, dup = _first_occurrences(keys)
        ks = [keys[i] for i in order]
        vs = [views[i] for i in order]
        native = _select_groups(native, order, len(keys))
        if zero_copy:
            codes = store.batch_put_from(ks, vs, native)
        elif upsert:
            codes = store.batch_upsert(ks, vs, native)
        else:
            codes = store.batch_put(ks, vs, native)
        out = [OK] * len(keys)
        for i, c in zip(order, codes, strict=True):
            out[i] = OK if c in (OK, OBJECT_ALREADY_EXISTS) else int(c)
        for i, j in dup.items():
            out[i] = out[j]
        return out

    def _write_resolved(
        self,
        store: Store,
        keys: list[str],
        views: Sequence[memoryview | None],
        native: Any,
        *,
        upsert: bool,
        zero_copy: bool = True,
    ) -> list[int]:
        """Write the keys whose memory resolved; -600 for the others (and for empty keys)."""
        out = [INVALID_PARAMS] * len(keys)
        good = [(i, v) for i, v in enumerate(views) if v is not None and keys[i]]
        if good:
            codes = self._batch_write(
                store,
                [keys[i] for i, _ in good],
                [v for _, v in good],
                _select_groups(native, [i for i, _ in good], len(keys)),
                upsert=upsert,
                zero_copy=zero_copy and not upsert,
            )
            for (i, _), c in zip(good, codes, strict=True):
                out[i] = c
        return out

    # ------------------------------------------------------------------ reads

    def _read(self, store: Store, key: str, wrap: Callable[[Any], T]) -> T:
        """The value of `key` wrapped by `wrap` (bytes or BufferHandle), copied once out of
        the staging buffer when it is free and large enough, else out of a fresh read."""
        staging = self._staging
        # Never wait for the staging buffer: a thread that finds it busy reads the plain way,
        # so concurrent gets are not serialised.
        if staging is not None and self._staging_lock.acquire(blocking=False):
            try:
                n = store.get_into(key, staging)
                return wrap(staging.data[:n])
            except InvalidParams:
                pass  # larger than the staging buffer: read it into memory of its own
            finally:
                self._staging_lock.release()
        return wrap(store.get(key))

    @staticmethod
    def _batch_values(store: Store, keys: list[str]) -> list[bytearray | None]:
        """The values of `keys` (None for a missing or empty key), in one batch read."""
        valid = [i for i, k in enumerate(keys) if k]
        got = store.batch_get([keys[i] for i in valid]) if valid else []
        out: list[bytearray | None] = [None] * len(keys)
        for i, v in zip(valid, got, strict=True):
            out[i] = v
        return out

    @answers(one_code)
    def _get_into(self, store: Store, key: str, ptr: int, size: int) -> int:
        """Read `key` into `size` registered bytes at `ptr`: bytes read or a code."""
        mv = self._pointers.resolve(ptr, size)
        return store.get_into(key, mv) if key else OBJECT_NOT_FOUND


def _first_occurrences(keys: list[str]) -> tuple[list[int], dict[int, int]]:
    """Indices of each key's first occurrence, and later duplicates → their first index.

    Mooncake writes a key named twice in one batch once, the first value, and answers the
    same for both (checked against the wheel); kvpool's Store refuses such batches.
    """
    first: dict[str, int] = {}
    order: list[int] = []
    dup: dict[int, int] = {}
    for i, k in enumerate(keys):
        j = first.setdefault(k, i)
        if j == i:
            order.append(i)
        else:
            dup[i] = j
    return order, dup


def _select_groups(native: Any, indices: list[int], n_keys: int) -> Any:
    """`native` for the keys at `indices` of a batch of `n_keys`: group ids are one per key
    (SGLang passes them so), so a batch written in part needs the matching part of them."""
    groups = None if native is None else native.group_ids
    if groups is None or len(indices) == n_keys or len(groups) != n_keys:
        return native  # nothing to select (or a mismatch the native config reports itself)
    return dataclasses.replace(native, group_ids=tuple(groups[i] for i in indices))
