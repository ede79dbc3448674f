"""`Locations`: where the values this Store put or read live, remembered for reads that skip
the master (`Store(read_mode="cached")`).

The keys an inference engine stores are hashes of token prefixes, so a key's bytes never
change. For such keys a get can go straight to the place the Store last saw the value at
(segment, offset), copy `size` bytes from there and check their xxh3_64 against the checksum
recorded when the value was written. A match means the bytes copied are exactly the value that
was put under the key; anything else (a mismatch because the range was freed and reused, a
segment that vanished, a transfer error) forgets the entry and the read asks the master as in
strict mode. A torn read (the range reused while it is copied) therefore never returns wrong
bytes: it fails the checksum.

What this may return that strict mode would not: a value that was removed, evicted or replaced
less than `ttl` seconds after the entry was remembered, as long as its bytes are still where
they were. Entries older than `ttl` are never used, so that is the bound on staleness; the
Store's own `remove` / `upsert` forget their keys at once, and the master's invalidation stream
(`kvpool.client.invalidation`, applied by `refresh` before each lookup) makes other clients'
removals usually felt within a round trip. The table is an LRU of at most
`capacity` entries; every method takes one lock for a few dictionary operations.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEFAULT_LOCATION_CAPACITY",
    "DEFAULT_LOCATION_TTL_S",
    "READ_MODES",
    "Locations",
    "ReadMode",
    "Remembered",
]

ReadMode = Literal["strict", "cached"]
READ_MODES: Final = ("strict", "cached")
DEFAULT_LOCATION_TTL_S: Final = 5.0
"""Seconds a remembered location may be used: the most a cached read may lag a removal."""
DEFAULT_LOCATION_CAPACITY: Final = 100_000
"""Entries remembered at most (about 200 bytes each with a 64-character key)."""


@dataclass(slots=True, frozen=True)
class Remembered:
    """One value's place: `size` bytes at `offset` of `segment`, whose xxh3_64 is `checksum`;
    `expires` is the monotonic time after which it is not used."""

    segment: str
    offset: int
    size: int
    checksum: int
    expires: float


class Locations:
    """A bounded, TTL-limited LRU of `Remembered` places by key (module docstring).
    Thread-safe. `clock` is injectable for tests (monotonic seconds)."""

    __slots__ = (
        "_clock",
        "_entries",
        "_lock",
        "capacity",
        "epoch",
        "hits",
        "misses",
        "refresh",
        "ttl",
    )

    def __init__(
        self,
        ttl: float = DEFAULT_LOCATION_TTL_S,
        capacity: int = DEFAULT_LOCATION_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[str, Remembered] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        #: Called before every lookup: applies the invalidations pushed since the last one
        #: (`kvpool.client.invalidation`); None without a stream.
        self.refresh: Callable[[], None] | None = None
        #: Counts forgets and clears: a place learnt by a read that began before one of them
        #: is not remembered (its invalidation may have come while the read ran).
        self.epoch = 0

    def __len__(self) -> int:
        return len(self._entries)

    def remember(
        self,
        key: str,
        segment: str,
        offset: int,
        size: int,
        checksum: int,
        *,
        epoch: int | None = None,
    ) -> None:
        """Remember that `key`'s value (of `size` bytes and `checksum`) is at `offset` of
        `segment`, for the next `ttl` seconds; not when `epoch` (read before the place was
        learnt) is no longer current."""
        entry = Remembered(segment, offset, size, checksum, self._clock() + self.ttl)
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return
            entries = self._entries
            entries[key] = entry
            entries.move_to_end(key)
            while len(entries) > self.capacity:
                entries.popitem(last=False)

    def remember_many(
        self,
        keys: Iterable[str],
        places: Iterable[tuple[str, int, int, int]],
        epoch: int | None = None,
    ) -> None:
        """`remember` of every (key, (segment, offset, size, checksum)), under one lock."""
        expires = self._clock() + self.ttl
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return
            entries = self._entries
            for key, (seg, off, size, csum) in zip(keys, places, strict=True):
                entries[key] = Remembered(seg, off, size, csum, expires)
                entries.move_to_end(key)
            while len(entries) > self.capacity:
                entries.popitem(last=False)

    def lookup(self, key: str) -> Remembered | None:
        """The place of `key` when remembered less than `ttl` ago, else None (an expired entry
        is dropped)."""
        if self.refresh is not None:
            self.refresh()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            if entry.expires < self._clock():
                del self._entries[key]
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def lookup_many(self, keys: list[str]) -> list[Remembered | None]:
        """`lookup` of every key, under one lock and one clock read."""
        if self.refresh is not None:
            self.refresh()
        now = self._clock()
        out: list[Remembered | None] = []
        with self._lock:
            entries = self._entries
            for key in keys:
                entry = entries.get(key)
                if entry is not None and entry.expires < now:
                    del entries[key]
                    entry = None
                if entry is None:
                    self.misses += 1
                else:
                    entries.move_to_end(key)
                    self.hits += 1
                out.append(entry)
        return out

    def forget(self, key: str) -> None:
        """Forget `key` (its value was removed, replaced or failed its check)."""
        with self._lock:
            self.epoch += 1
            self._entries.pop(key, None)

    def forget_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            self.epoch += 1
            for key in keys:
                self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything (e.g. a lost master connection, or `remove_all`)."""
        with self._lock:
            self.epoch += 1
            self._entries.clear()
