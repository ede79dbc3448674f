"""`HotCache`: values of remote replicas kept in this process's memory (`Store(hot_cache_size=)`).

Mooncake keeps hot remote objects in a local DRAM cache of the client
(`MC_STORE_LOCAL_HOT_CACHE_SIZE`); this is kvpool's. It only holds values read from replicas
that are not on this host (a same-host replica is one memcpy away already) and only in cached
read mode, whose promise it keeps: an entry is dropped by the invalidation stream and by this
Store's own removals and overwrites like a remembered place, and is never used after
`ttl` seconds (the same bound as a remembered place). A value is admitted on its second read
within the admission window (`seen`: the last `capacity_keys` keys read once), so a scan does
not wash out what is hot; values larger than a quarter of the cache are never admitted. The
cache holds at most `capacity` bytes of values (LRU). Values were verified against their
checksum when they were read and are kept as immutable bytes: a hit is one copy, no check.
Thread-safe (one lock).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["HotCache"]

_SEEN_KEYS = 65536
"""Keys remembered as read once (the admission window)."""


class HotCache:
    """Admitted values by key, LRU, at most `capacity` bytes (module docstring)."""

    __slots__ = (
        "_clock",
        "_entries",
        "_lock",
        "_seen",
        "admitted",
        "capacity",
        "epoch",
        "hits",
        "misses",
        "nbytes",
        "ttl",
    )

    def __init__(
        self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.admitted = 0
        #: Counts forgets and clears: a value read while one happened is not admitted (its
        #: invalidation may have come between the read and the offer).
        self.epoch = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def hit_ratio(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0

    def get(self, key: str) -> bytes | None:
        """The cached value of `key`, or None (an expired entry is dropped)."""
        with self._lock:
            got = self._entries.get(key)
            if got is None:
                self.misses += 1
                return None
            value, expires = got
            if expires < self._clock():
                self._drop(key)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def offer(self, key: str, value: bytes | bytearray | memoryview, epoch: int) -> None:
        """`key` was just read from a remote replica as `value` (verified), the read having
        started at `epoch`: admit it if it was read before within the window and nothing was
        invalidated since."""
        n = len(value) if not isinstance(value, memoryview) else value.nbytes
        if n > self.capacity // 4:
            return
        with self._lock:
            if epoch != self.epoch:
                return
            if key in self._entries:
                return
            seen = self._seen
            if key not in seen:
                seen[key] = None
                if len(seen) > _SEEN_KEYS:
                    seen.popitem(last=False)
                return
            del seen[key]
        data = bytes(value)  # outside the lock: the copy is the costly part
        with self._lock:
            if key in self._entries or epoch != self.epoch:
                return
            self._entries[key] = (data, self._clock() + self.ttl)
            self.nbytes += n
            self.admitted += 1
            while self.nbytes > self.capacity:
                _, (evicted, _expires) = self._entries.popitem(last=False)
                self.nbytes -= len(evicted)

    def forget_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            self.epoch += 1
            for key in keys:
                self._drop(key)
                self._seen.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self.epoch += 1
            self._entries.clear()
            self._seen.clear()
            self.nbytes = 0

    def _drop(self, key: str) -> None:
        got = self._entries.pop(key, None)
        if got is not None:
            self.nbytes -= len(got[0])
