"""`KeyLocks`: the lookup-lock counts an L2 adapter keeps per key.

A successful lookup-and-lock takes one lock per found key, `submit_unlock` gives one back, and
`close()` drops them all (seed 003: close releases every in-flight lock). Not thread-safe by
itself: adapters call it under their own lock, where the rest of their task state lives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey

__all__ = ["KeyLocks"]


class KeyLocks:
    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: Counter[ObjectKey] = Counter()

    def lock_found(self, keys: Sequence[ObjectKey], found: Bitmap) -> None:
        """One more lock on each key whose bit is set in `found`."""
        for i in found:
            self._counts[keys[i]] += 1

    def unlock(self, keys: Sequence[ObjectKey]) -> None:
        """One lock fewer per key; unlocking a key that holds none is harmless."""
        for k in keys:
            if self._counts[k] > 1:
                self._counts[k] -= 1
            else:
                self._counts.pop(k, None)

    def is_locked(self, key: ObjectKey) -> bool:
        return self._counts.get(key, 0) > 0

    def held(self) -> dict[ObjectKey, int]:
        """Every locked key with its count."""
        return {k: n for k, n in self._counts.items() if n}

    def clear(self) -> None:
        self._counts.clear()
