"""Segments a `MooncakeDistributedStore` mounts after setup, and their unmounts.

Mooncake keeps two records per client, and so does this module: segments mounted over a
caller's file or shared memory by `mount_segment` (unmounted by `unmount_segment`) and fresh
memory from `allocate_and_mount_segment` (unmounted by `unmount_and_free_segment`). An id from
one record is unknown to the other call: -1, as the wheel answers (checked on 0.3.13). The
segment created by `setup` is in neither.

Ids are kvpool segment names (`<transfer endpoint>/<n>`); Mooncake's are "<high>-<low>" UUID
pairs. Both are opaque strings to a caller.

A graceful unmount (`grace_period_seconds > 0`) answers at once, as Mooncake's, and unmounts
when the grace period ends, from a timer thread; meanwhile the segment stays readable. Mooncake's
master also stops allocating on it at once (GRACEFULLY_UNMOUNTING); kvpool's master has no such
state, so puts may still land there and are dropped with the segment at the deadline (a cache
loses entries, nothing reads a freed range). A second unmount of a segment being unmounted
gracefully answers -600, the wheel's answer. `close()` cancels pending timers; the Store's own
close unmounts whatever is left.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Final

from kvpool.client import Store
from kvpool.errors import ErrorCode, KVPoolError

__all__ = ["Kind", "MountedSegments"]

log = logging.getLogger(__name__)

OK: Final = 0
REFUSED: Final = int(ErrorCode.INTERNAL_ERROR)
"""Mooncake answers -1 for an id it has no record of, and for every refused mount."""
BEING_UNMOUNTED: Final = int(ErrorCode.INVALID_PARAMS)


class Kind(enum.Enum):
    FILE = "mount_segment"
    ALLOCATED = "allocate_and_mount_segment"


class MountedSegments:
    """The segments one compat store mounted after setup (see the module docstring).

    Thread-safe. `on_gone(name)` is called once a segment is unmounted (the store drops it
    from its name translation there).
    """

    def __init__(self, on_gone: Callable[[str], None]) -> None:
        self._on_gone = on_gone
        self._lock = threading.Lock()
        self._kind: dict[str, Kind] = {}
        self._graceful: set[str] = set()
        self._timers: dict[str, threading.Timer] = {}

    def add(self, name: str, kind: Kind) -> None:
        with self._lock:
            self._kind[name] = kind

    def unmount(self, store: Store, ids: list[str], kind: Kind, grace_s: int) -> int:
        """Unmount every one of `ids` (a failed id does not stop the others); 0, else -1 when
        any id is unknown, else the first failure's code: the wheel checks every id against its
        records first and answers -1 for any miss, after unmounting the ids it knows."""
        codes = [self._unmount_one(store, sid, kind, grace_s) for sid in ids]
        if REFUSED in codes:
            return REFUSED
        return next((c for c in codes if c != OK), OK)

    def _unmount_one(self, store: Store, sid: str, kind: Kind, grace_s: int) -> int:
        with self._lock:
            if sid in self._graceful:
                log.error("%s: segment %s is already being unmounted", kind.value, sid)
                return BEING_UNMOUNTED
            if self._kind.get(sid) is not kind:
                log.error("%s: segment %s is not in this store's records", kind.value, sid)
                return REFUSED
            del self._kind[sid]
            if grace_s > 0:
                self._graceful.add(sid)
                timer = threading.Timer(grace_s, self._unmount_late, (store, sid))
                timer.name = f"kvpool-graceful-unmount-{sid}"
                timer.daemon = True
                self._timers[sid] = timer
                timer.start()
                return OK
        try:
            store.unmount_segment(sid)
        except KVPoolError as exc:
            log.error("unmount of segment %s failed: %s", sid, exc)
            with self._lock:
                self._kind[sid] = kind  # still mounted: it may be unmounted again
            return int(exc.code)
        self._on_gone(sid)
        return OK

    def _unmount_late(self, store: Store, sid: str) -> None:
        try:
            store.unmount_segment(sid)
        except KVPoolError as exc:
            # Closed meanwhile (close() unmounted it), or the master is unreachable: the
            # Store's close() unmounts what is left.
            log.warning("graceful unmount of segment %s: %s", sid, exc)
        finally:
            with self._lock:
                self._timers.pop(sid, None)
            self._on_gone(sid)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the pending graceful unmounts (tests)."""
        with self._lock:
            timers = list(self._timers.values())
        for t in timers:
            t.join(timeout)

    def close(self) -> None:
        """Cancel the pending graceful unmounts (the Store's close() unmounts everything)."""
        with self._lock:
            timers = list(self._timers.values())
            self._timers.clear()
            self._kind.clear()
            self._graceful.clear()
        for t in timers:
            t.cancel()
            if t is not threading.current_thread():
                t.join()
