"""Mooncake's get calls: values as bytes or handles, reads into registered memory, byte ranges.

What differs from the native Store's reads, and why each call here exists:

* a miss is an answer, never an exception: `get` answers b"" (also for any failure),
  `get_buffer` None, `get_batch` b"" per missing key and [b""] when the whole batch fails, the
  pointer calls -704;
* `get` and `get_buffer` read through the local buffer set up by `setup` and copy out once
  (base.StoreBase._read); a value larger than it is read into memory of its own;
* raw-pointer calls write only into memory registered with `register_buffer`; anything else
  answers -600 and is never dereferenced;
* `get_into_ranges` and the multi-buffer forms read each object once, whole, and copy from it.
"""

from __future__ import annotations

from kvpool.client import Store
from kvpool.codes import INVALID_PARAMS, OBJECT_NOT_FOUND, UNAVAILABLE_IN_CURRENT_STATUS
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import answers, as_code, check_key, check_keys, index, per_key
from kvpool.compat.mooncake.memory import BufferHandle

__all__ = ["Reads"]


def _no_batch(code: int, *_: object) -> list[bytes]:
    return [b""]


def _no_handles(code: int, keys: list[str], *_: object) -> list[BufferHandle | None]:
    return [None] * len(keys)


class Reads(StoreBase):
    """The get calls of `MooncakeDistributedStore`."""

    def get(self, key: str) -> bytes:
        """The value of `key`; b"" when it is missing or anything fails (Mooncake's answer)."""
        # Not wrapped by `answers`: the hottest read, and its fault answer needs no code.
        k = check_key(key)
        store = self._store
        if store is None or not k:
            return b""
        try:
            return self._read(store, k, bytes)
        except Exception as exc:
            as_code(exc)  # logged when unexpected
            return b""

    def get_batch(self, keys: list[str]) -> list[bytes]:
        """The values, b"" for each missing key; [b""] when the whole batch fails."""
        return self._get_batch(check_keys(keys))

    @answers(_no_batch)
    def _get_batch(self, store: Store, keys: list[str]) -> list[bytes]:
        if not keys:
            return [b""]
        return [b"" if v is None else bytes(v) for v in self._batch_values(store, keys)]

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value as a BufferHandle (ptr(), size(), buffer protocol); None on a miss."""
        k = check_key(key)  # not wrapped by `answers`, as `get`
        store = self._store
        if store is None or not k:
            return None
        try:
            return self._read(store, k, BufferHandle)
        except Exception as exc:
            as_code(exc)
            return None

    def batch_get_buffer(self, keys: list[str]) -> list[BufferHandle | None]:
        return self._batch_get_buffer(check_keys(keys))

    @answers(_no_handles)
    def _batch_get_buffer(self, store: Store, keys: list[str]) -> list[BufferHandle | None]:
        return [None if v is None else BufferHandle(v) for v in self._batch_values(store, keys)]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Read `key` into `size` registered bytes at `buffer_ptr`; bytes read or a code
        (-600 when the buffer is too small or not registered)."""
        return self._get_into(check_key(key), index(buffer_ptr), index(size))

    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        """get_into per key: bytes read or a code per key (-600 for all on a length mismatch)."""
        ks = check_keys(keys)
        ptrs, ns = [index(p) for p in buffer_ptrs], [index(s) for s in sizes]
        return self._batch_get_into(ks, ptrs, ns)

    @answers(per_key)
    def _batch_get_into(
        self, store: Store, keys: list[str], ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        views = [self._pointers.find(p, n) for p, n in zip(ptrs, sizes, strict=True)]
        for i, k in enumerate(keys):
            if views[i] is not None and not k:
                out[i] = OBJECT_NOT_FOUND
        good = [(i, v) for i, v in enumerate(views) if v is not None and keys[i]]
        if good:
            got = store.batch_get_into([keys[i] for i, _ in good], [v for _, v in good])
            for (i, _), n in zip(good, got, strict=True):
                out[i] = int(n)
        return out

    def batch_get_into_multi_buffers(
        self,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatter each value over its registered buffers, in order; bytes read per key."""
        ks = check_keys(keys)
        ptrs = [[index(p) for p in row] for row in all_buffer_ptrs]
        ns = [[index(s) for s in row] for row in all_sizes]
        return self._get_scattered(ks, ptrs, ns)

    @answers(per_key)
    def _get_scattered(
        self, store: Store, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        out = [INVALID_PARAMS] * len(keys)
        targets: dict[int, list[memoryview]] = {}
        for i, (prow, nrow) in enumerate(zip(ptrs, sizes, strict=True)):
            parts = [self._pointers.find(p, n) for p, n in zip(prow, nrow, strict=False)]
            if len(prow) == len(nrow) and prow and all(p is not None for p in parts):
                targets[i] = [p for p in parts if p is not None]
        order = list(targets)
        values = self._batch_values(store, [keys[i] for i in order])
        for i, value in zip(order, values, strict=True):
            if value is None:
                out[i] = OBJECT_NOT_FOUND
                continue
            if len(value) > sum(p.nbytes for p in targets[i]):
                continue  # INVALID_PARAMS: the buffers are too small
            at = 0
            for part in targets[i]:
                chunk = value[at : at + part.nbytes]
                part[: len(chunk)] = chunk
                at += len(chunk)
            out[i] = len(value)
        return out

    def get_into_ranges(
        self,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[list[int]]],
        all_src_offsets: list[list[list[int]]],
        all_sizes: list[list[list[int]]],
    ) -> list[list[list[int]]]:
        """Byte ranges of objects into registered buffers, buffer by buffer: for buffer `b`,
        key `k` of `all_keys[b]` and its fragment `i`, copy `all_sizes[b][k][i]` bytes from
        offset `all_src_offsets[b][k][i]` of the object to `buffer_ptrs[b] +
        all_dst_offsets[b][k][i]`. Answers the bytes copied (or a code) per fragment, shaped
        like `all_sizes`; mismatched lengths answer -600 at the level where they occur (the
        shapes the wheel answers). Each object is read once, whole, then copied from."""
        # Not wrapped by `answers`: a key or offset of the wrong type raises TypeError however
        # deep it sits, and only the read itself answers a fault code.
        n = len(buffer_ptrs)
        starts = [index(p) for p in buffer_ptrs]
        store = self._store
        if store is None:
            return [[[UNAVAILABLE_IN_CURRENT_STATUS]] for _ in range(n)]
        if not n == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes):
            return [[[INVALID_PARAMS]] for _ in range(n)]
        rows = list(zip(all_keys, all_dst_offsets, all_src_offsets, all_sizes, strict=True))
        shaped = [len(k) == len(d) == len(s) == len(z) for k, d, s, z in rows]
        wanted = sorted(
            {check_key(k) for ok, row in zip(shaped, rows, strict=True) if ok for k in row[0]}
        )
        try:
            values = dict(zip(wanted, self._batch_values(store, wanted), strict=True))
        except Exception as exc:
            return [[[as_code(exc)]] for _ in range(n)]
        out: list[list[list[int]]] = []
        for start, ok, (keys, dsts, srcs, sizes) in zip(starts, shaped, rows, strict=True):
            if not ok:
                out.append([[INVALID_PARAMS] for _ in keys])
                continue
            row: list[list[int]] = []
            for key, dst, src, size in zip(keys, dsts, srcs, sizes, strict=True):
                if not len(dst) == len(src) == len(size):
                    row.append([INVALID_PARAMS])
                    continue
                value = values.get(key)
                frags: list[int] = []
                for d, s_off, z in zip(dst, src, size, strict=True):
                    frags.append(self._copy_range(value, start + index(d), index(s_off), index(z)))
                row.append(frags)
            out.append(row)
        return out

    def _copy_range(self, value: bytearray | None, dst: int, src: int, size: int) -> int:
        if value is None:
            return OBJECT_NOT_FOUND
        if size == 0:
            return 0
        if src < 0 or size < 0 or src + size > len(value):
            return INVALID_PARAMS
        view = self._pointers.find(dst, size)
        if view is None:
            return INVALID_PARAMS
        view[:] = value[src : src + size]
        return size
