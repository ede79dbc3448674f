"""`Bitmap`: the per-key outcome of an L2 lookup or load, and the load plans built from them.

Seed 003 reports lookup and load results key by key ("fine-grained"): bit i stands for keys[i]
of the request. LMCache ships a C++ bitmap; ours is a Python int used as a bit set, which makes
AND/OR/NOT and popcount single big-int operations (fast enough for the thousands of chunks one
request carries) and keeps the type immutable-by-value where that matters: every operator
returns a new Bitmap, only `set`/`clear`/`set_range`/`batched_set` change one in place.

Bit 0 is the first key. The prefix operations (`count_leading_ones`, `prefix`) are what the
prefetch controller's prefix-only loading is built on.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from kvpool.errors import InvalidParams

__all__ = ["Bitmap"]

T = TypeVar("T")


class Bitmap:
    """A fixed-size set of bit positions 0..size-1."""

    __slots__ = ("_bits", "_size")

    def __init__(self, size: int, prefix_bits: int = 0) -> None:
        """`size` bits, the first `prefix_bits` of them set."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidParams(f"Bitmap size must be an int >= 0, got {size!r}")
        if not 0 <= prefix_bits <= size:
            raise InvalidParams(f"Bitmap prefix_bits must be in [0, {size}], got {prefix_bits!r}")
        self._size = size
        self._bits = (1 << prefix_bits) - 1

    @classmethod
    def from_bools(cls, flags: Iterable[bool]) -> Bitmap:
        values = list(flags)
        bm = cls(len(values))
        bits = 0
        for i, flag in enumerate(values):
            if flag:
                bits |= 1 << i
        bm._bits = bits
        return bm

    @classmethod
    def from_indices(cls, size: int, indices: Iterable[int]) -> Bitmap:
        bm = cls(size)
        bm.batched_set(indices)
        return bm

    # -- size and single bits ---------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    def __len__(self) -> int:
        return self._size

    def _check(self, i: int) -> None:
        if not 0 <= i < self._size:
            raise InvalidParams(f"bit {i} is outside a Bitmap of size {self._size}")

    def set(self, i: int) -> None:
        self._check(i)
        self._bits |= 1 << i

    def clear(self, i: int) -> None:
        self._check(i)
        self._bits &= ~(1 << i)

    def test(self, i: int) -> bool:
        self._check(i)
        return bool(self._bits >> i & 1)

    def __getitem__(self, i: int) -> bool:
        return self.test(i)

    def batched_set(self, indices: Iterable[int]) -> None:
        for i in indices:
            self.set(i)

    def set_range(self, start: int, end: int) -> None:
        """Set bits start..end-1."""
        if not 0 <= start <= end <= self._size:
            raise InvalidParams(f"range [{start}, {end}) is outside a Bitmap of size {self._size}")
        self._bits |= ((1 << (end - start)) - 1) << start

    # -- counts -----------------------------------------------------------------------------

    def popcount(self) -> int:
        return self._bits.bit_count()

    def any(self) -> bool:
        return self._bits != 0

    def count_leading_ones(self) -> int:
        """How many bits are set from bit 0 on before the first clear bit (the hit prefix)."""
        # bits ^ (bits + 1) sets exactly the run of trailing ones plus the next bit.
        run = (self._bits ^ (self._bits + 1)).bit_length() - 1
        return min(run, self._size)

    def count_leading_zeros(self) -> int:
        """How many bits are clear from bit 0 on before the first set bit."""
        if self._bits == 0:
            return self._size
        return (self._bits & -self._bits).bit_length() - 1

    def highest_set_bit(self) -> int:
        """Index of the last set bit, -1 when none is set."""
        return self._bits.bit_length() - 1

    # -- whole-map operations ---------------------------------------------------------------

    def _mask(self) -> int:
        return (1 << self._size) - 1

    def _new(self, size: int, bits: int) -> Bitmap:
        bm = Bitmap(size)
        bm._bits = bits & bm._mask()
        return bm

    def __and__(self, other: Bitmap) -> Bitmap:
        return self._new(min(self._size, other._size), self._bits & other._bits)

    def __or__(self, other: Bitmap) -> Bitmap:
        return self._new(min(self._size, other._size), self._bits | other._bits)

    def __invert__(self) -> Bitmap:
        return self._new(self._size, ~self._bits)

    def without(self, other: Bitmap) -> Bitmap:
        """The bits of self that are not in other (self & ~other)."""
        return self._new(self._size, self._bits & ~other._bits)

    def prefix(self, n: int) -> Bitmap:
        """A copy with every bit at index >= n cleared."""
        n = max(0, min(n, self._size))
        return self._new(self._size, self._bits & ((1 << n) - 1))

    def overlaps(self, other: Bitmap) -> bool:
        return (self._bits & other._bits) != 0

    def copy(self) -> Bitmap:
        return self._new(self._size, self._bits)

    # -- views ------------------------------------------------------------------------------

    def indices(self) -> list[int]:
        return list(self)

    def get_indices_list(self) -> list[int]:
        return list(self)

    def get_indices_set(self) -> builtins.set[int]:
        return builtins.set(self)

    def __iter__(self) -> Iterator[int]:
        """The indices of the set bits, ascending."""
        bits = self._bits
        while bits:
            low = bits & -bits
            yield low.bit_length() - 1
            bits ^= low

    def gather(self, items: Sequence[T]) -> list[T]:
        """The items whose bit is set, in order."""
        if len(items) != self._size:
            raise InvalidParams(f"gather: {len(items)} items for a Bitmap of size {self._size}")
        return [items[i] for i in self]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bitmap):
            return NotImplemented
        return self._size == other._size and self._bits == other._bits

    def __hash__(self) -> int:
        return hash((self._size, self._bits))

    def __repr__(self) -> str:
        return (
            "Bitmap('"
            + "".join("1" if self._bits >> i & 1 else "0" for i in range(self._size))
            + "')"
        )
