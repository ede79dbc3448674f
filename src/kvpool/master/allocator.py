"""Offset allocator of one segment: hands out aligned byte ranges of `[0, capacity)`.

The master never touches segment memory; it only decides which range of a segment each replica
occupies. This allocator is a two-level segregated fit (TLSF-like, as Mooncake's
`OffsetBufferAllocator`):

* Free blocks are kept in size bins: eight bins per power of two (3 mantissa bits), so a bin's
  sizes differ by at most 12.5 %. An int bitmap of the non-empty bins finds the first bin at or
  above a size in O(1) (`x & -x`).
* Allocation rounds the request up to `alignment`, searches from the first bin whose *smallest*
  size already fits (so any block there fits: O(1)), splits the block, and puts the tail back.
  Only when that fails (the pool is nearly full) does it look through the request's own bin for
  a block that happens to be big enough; that scan is bounded by that bin's population and runs
  only on the path that would otherwise answer "no space".
* Free coalesces with both neighbours in O(1) through two dicts (free block by start, by end),
  so no two free blocks are ever adjacent.

Allocated blocks are not tracked here: the caller (a replica record) keeps `(offset, size)` and
gives both back to `free`, which keeps the allocator at zero bytes per stored object.
"""

from __future__ import annotations

__all__ = ["OffsetAllocator"]

_SUB_BITS = 3
_SUB = 1 << _SUB_BITS


def _bin_floor(units: int) -> int:
    """The bin holding blocks of `units` alignment units (monotonic in `units`)."""
    if units < _SUB:
        return units
    e = units.bit_length() - 1
    return ((e - _SUB_BITS + 1) << _SUB_BITS) | ((units >> (e - _SUB_BITS)) & (_SUB - 1))


def _bin_min_units(b: int) -> int:
    """The smallest block size (in units) that lands in bin `b`."""
    if b < _SUB:
        return b
    e = (b >> _SUB_BITS) + _SUB_BITS - 1
    return (_SUB | (b & (_SUB - 1))) << (e - _SUB_BITS)


# Bin lower bounds for every bin a 64-bit size can reach, looked up instead of computed on the
# allocation path.
_BIN_MIN: list[int] = [_bin_min_units(b) for b in range((64 - _SUB_BITS + 1) << _SUB_BITS)]


class OffsetAllocator:
    """Aligned ranges of `[0, capacity)`; every size and offset is a multiple of `alignment`.

    Not thread-safe: the master's event loop is its only user.
    """

    __slots__ = ("_bins", "_bitmap", "_by_end", "_by_start", "alignment", "allocated", "capacity")

    def __init__(self, capacity: int, alignment: int = 64) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.alignment = alignment
        # A tail shorter than one alignment unit could never be handed out.
        self.capacity = capacity - capacity % alignment
        self.allocated = 0
        # Everything below is in alignment units, so the bins see small ints.
        self._by_start: dict[int, int] = {}  # start -> length of a free block
        self._by_end: dict[int, int] = {}  # end -> start of a free block
        self._bins: dict[int, dict[int, None]] = {}  # bin -> starts of its free blocks
        self._bitmap = 0
        if self.capacity:
            self._insert(0, self.capacity // alignment)

    # ---------------------------------------------------------------- public

    def aligned(self, size: int) -> int:
        """`size` rounded up to the alignment: what `alloc(size)` really takes."""
        a = self.alignment
        return (size + a - 1) // a * a

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.allocated

    def alloc(self, size: int) -> int | None:
        """The offset of a new block of at least `size` bytes, or None when nothing fits."""
        if size <= 0:
            raise ValueError(f"size must be > 0, got {size}")
        a = self.alignment
        units = (size + a - 1) // a
        # _bin_floor(units), inlined, rounded up to the first bin whose every block fits.
        if units < _SUB:
            b = units
        else:
            e = units.bit_length() - 1
            b = ((e - _SUB_BITS + 1) << _SUB_BITS) | ((units >> (e - _SUB_BITS)) & (_SUB - 1))
            if _BIN_MIN[b] < units:
                b += 1
        mask = self._bitmap >> b
        if not mask:
            found = self._fit_in_own_bin(units)
            if found is None:
                return None
            start, length = found
            self._remove(start, length)
            if length > units:
                self._insert(start + units, length - units)
            self.allocated += units * a
            return start * a
        # The hot path, written out: take any block of the first non-empty bin at or above b
        # and keep its tail where it is when the tail still belongs to the same bin (the
        # common case for a large free block), which saves most of the dict and bitmap work.
        b += (mask & -mask).bit_length() - 1
        bucket = self._bins[b]
        start = bucket.popitem()[0]
        by_start = self._by_start
        length = by_start.pop(start)
        end = start + length
        rest = length - units
        if rest:
            tail = start + units
            by_start[tail] = rest
            self._by_end[end] = tail  # same end, new start
            if rest >= _BIN_MIN[b]:  # smaller than the block, not below its bin: same bin
                bucket[tail] = None
            else:
                rb = _bin_floor(rest)
                if not bucket:
                    del self._bins[b]
                    self._bitmap &= ~(1 << b)
                other = self._bins.get(rb)
                if other is None:
                    self._bins[rb] = {tail: None}
                    self._bitmap |= 1 << rb
                else:
                    other[tail] = None
        else:
            del self._by_end[end]
            if not bucket:
                del self._bins[b]
                self._bitmap &= ~(1 << b)
        self.allocated += units * a
        return start * a

    def free(self, offset: int, size: int) -> None:
        """Give back the block `alloc(size)` answered `offset` for; merges free neighbours."""
        a = self.alignment
        if offset % a or size <= 0:
            raise ValueError(f"not a block of this allocator: offset={offset} size={size}")
        start = offset // a
        units = (size + a - 1) // a
        end = start + units
        if start in self._by_start or end in self._by_end or end * a > self.capacity:
            raise ValueError(f"double or foreign free: offset={offset} size={size}")
        self.allocated -= units * a
        left = self._by_end.get(start)
        if left is not None:
            self._remove(left, start - left)
            start = left
        right_len = self._by_start.get(end)
        if right_len is not None:
            self._remove(end, right_len)
            end += right_len
        self._insert(start, end - start)

    def alloc_at(self, offset: int, size: int) -> bool:
        """Take exactly [offset, offset + size) (rounded out to the alignment) if all of it is
        free; False otherwise. O(free blocks): for rare uses (re-reserving the ranges a writer
        may still use when a segment is mounted again), not for the put path."""
        a = self.alignment
        if size <= 0 or offset < 0:
            return False
        start = offset // a
        end = (offset + size + a - 1) // a
        for s, n in self._by_start.items():
            if s <= start and end <= s + n:
                self._remove(s, n)
                if start > s:
                    self._insert(s, start - s)
                if s + n > end:
                    self._insert(end, s + n - end)
                self.allocated += (end - start) * a
                return True
        return False

    def free_blocks(self) -> list[tuple[int, int]]:
        """The free blocks as sorted `(offset, size)` in bytes (for tests and stats; O(n log n))."""
        a = self.alignment
        return sorted((s * a, n * a) for s, n in self._by_start.items())

    def largest_free(self) -> int:
        """Bytes of the largest free block (O(bins), for stats and placement hints)."""
        if not self._bitmap:
            return 0
        top = self._bitmap.bit_length() - 1
        return max(self._by_start[s] for s in self._bins[top]) * self.alignment

    def free_ending_at(self, offset: int) -> int:
        """Bytes of the free block that ends exactly at `offset` (0 when there is none): what
        freeing a block starting there would merge with on its left. O(1)."""
        a = self.alignment
        if offset % a:
            return 0
        start = self._by_end.get(offset // a)
        return 0 if start is None else (offset // a - start) * a

    def free_starting_at(self, offset: int) -> int:
        """Bytes of the free block that starts exactly at `offset` (0 when there is none): what
        freeing a block ending there would merge with on its right. O(1)."""
        a = self.alignment
        if offset % a:
            return 0
        return self._by_start.get(offset // a, 0) * a

    # ---------------------------------------------------------------- internals

    def _fit_in_own_bin(self, units: int) -> tuple[int, int] | None:
        bucket = self._bins.get(_bin_floor(units))
        if bucket:
            by_start = self._by_start
            for start in bucket:
                length = by_start[start]
                if length >= units:
                    return start, length
        return None

    def _insert(self, start: int, length: int) -> None:
        self._by_start[start] = length
        self._by_end[start + length] = start
        b = _bin_floor(length)
        bucket = self._bins.get(b)
        if bucket is None:
            self._bins[b] = {start: None}
            self._bitmap |= 1 << b
        else:
            bucket[start] = None

    def _remove(self, start: int, length: int) -> None:
        del self._by_start[start]
        del self._by_end[start + length]
        b = _bin_floor(length)
        bucket = self._bins[b]
        del bucket[start]
        if not bucket:
            del self._bins[b]
            self._bitmap &= ~(1 << b)
