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
removals usually felt within a round trip. Disk-tier and DFS replicas are remembered too (a
get then reads the tier's file, or asks the owning node for one transfer, with no master round
trip); the master also pushes the keys whose disk or DFS replica leaves while the object stays
(evicted from the disk tier, found bad, its file vanished) and those promoted back to memory,
so such an entry is forgotten as soon as its place changes. The table is an LRU of at most
`capacity` entries; every method takes one lock for a few dictionary operations.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

from kvpool.protocol.messages import ReplicaDesc, ReplicaKind

__all__ = [
    "DEFAULT_LOCATION_CAPACITY",
    "DEFAULT_LOCATION_TTL_S",
    "READ_MODES",
    "Locations",
    "ReadMode",
    "Remembered",
    "segment_places",
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
    `expires` is the monotonic time after which it is not used. `replica` is the replica's
    description when it is a disk-tier or DFS replica (read from its file, not copied from a
    segment's memory: `kvpool.client.reader`), None for a memory replica."""

    segment: str
    offset: int
    size: int
    checksum: int
    expires: float
    replica: ReplicaDesc | None = None


class Locations:
    """A bounded, TTL-limited LRU of `Remembered` places by key (module docstring).
    Thread-safe. `clock` is injectable for tests (monotonic seconds)."""

    __slots__ = (
        "_clock",
        "_entries",
        "_lock",
        "capacity",
        "epoch",
        "files",
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
        #: DFS places remembered so far: batches, which copy from segments, skip such entries
        #: only when there may be some (`kvpool.client.reader`).
        self.files = 0

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
        replica: ReplicaDesc | None = None,
    ) -> None:
        """Remember that `key`'s value (of `size` bytes and `checksum`) is at `offset` of
        `segment` (a disk-tier or DFS `replica`, or memory), for the next `ttl` seconds; not
        when `epoch` (read before the place was learnt) is no longer current."""
        entry = Remembered(segment, offset, size, checksum, self._clock() + self.ttl, replica)
        with self._lock:
            if epoch is not None and epoch != self.epoch:
                return
            if replica is not None and replica.kind == ReplicaKind.DFS:
                self.files += 1
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


def segment_places(entries: list[Remembered | None]) -> list[Remembered | None]:
    """`entries` without the DFS places (None instead): a batch copies remembered places from
    segments, and a DFS file is none (those keys go to the master with the misses)."""
    return [
        None if e is not None and e.replica is not None and e.replica.kind == ReplicaKind.DFS else e
        for e in entries
    ]
