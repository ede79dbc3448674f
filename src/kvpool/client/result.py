"""What a put achieved: `PutResult` (one put, `Store.put_ex`) and `PutStats` (a Store's counters).

`replica_num` is best effort, as in Mooncake: with fewer live segments than asked (or fewer with
room) the master allocates fewer replicas and the put succeeds. `Store.put` keeps answering a
bool (True: stored); `Store.put_ex` answers a `PutResult` that also says how many replicas were
written, and every Store counts such *degraded* puts (`Store.put_stats`) and logs a warning
about them at most once per `WARN_INTERVAL_S`, with how many happened since the last one.

A put whose write to a replica's segment failed (a node died and the master does not know
yet) is revoked and started again on other segments (`kvpool.client.writer`); `PutStats.retries`
counts those restarts and `PutStats.retry_failures` the puts that failed even so.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Final

__all__ = ["WARN_INTERVAL_S", "PutResult", "PutStats", "PutStatsRecorder"]

log = logging.getLogger(__name__)

WARN_INTERVAL_S: Final = 10.0
"""At most one warning about degraded puts per this many seconds, per Store."""


@dataclass(frozen=True, slots=True)
class PutResult:
    """The outcome of one put. Truthy when the value was stored, like `put`'s bool."""

    stored: bool
    """True: the value was written and is readable; False: the key existed (nothing written)."""
    replicas: int
    """Replicas written (0 when not stored)."""
    requested: int
    """Replicas the put's config asked for."""

    @property
    def degraded(self) -> bool:
        """Stored with fewer replicas than asked (too few live segments with room)."""
        return self.stored and self.replicas < self.requested

    def __bool__(self) -> bool:
        return self.stored


@dataclass(frozen=True, slots=True)
class PutStats:
    """A snapshot of a Store's put counters since it was made."""

    degraded: int = 0
    """Keys stored with fewer replicas than their config asked for."""
    retries: int = 0
    """Times a put (or a batch's keys) was revoked and started again after a write to a
    replica's segment failed."""
    retry_failures: int = 0
    """Puts (or batch keys) that still failed after their retries."""


class PutStatsRecorder:
    """The counters behind `PutStats`, thread-safe; the warning about degraded puts is rate
    limited here. Called only off the hot path (a degraded or retried put)."""

    __slots__ = ("_degraded", "_last_warn", "_lock", "_retries", "_retry_failures", "_unwarned")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._degraded = 0
        self._retries = 0
        self._retry_failures = 0
        self._unwarned = 0
        self._last_warn = -WARN_INTERVAL_S

    def degraded(self, key: str, got: int, want: int, count: int = 1) -> None:
        now = time.monotonic()
        with self._lock:
            self._degraded += count
            self._unwarned += count
            if now - self._last_warn < WARN_INTERVAL_S:
                return
            n, self._unwarned, self._last_warn = self._unwarned, 0, now
        log.warning(
            "%d put(s) stored fewer replicas than asked since the last warning (%r: %d of %d); "
            "too few live segments with room (Store.put_stats, Store.put_ex)",
            n,
            key,
            got,
            want,
        )

    def retried(self, count: int = 1) -> None:
        with self._lock:
            self._retries += count

    def retry_failed(self, count: int = 1) -> None:
        with self._lock:
            self._retry_failures += count

    def snapshot(self) -> PutStats:
        with self._lock:
            return PutStats(self._degraded, self._retries, self._retry_failures)
