"""Segments a `MooncakeDistributedStore` mounts after setup: the calls, and their records.

Mooncake keeps two records per client, and so does this module: segments mounted over a
caller's file or shared memory by `mount_segment` (unmounted by `unmount_segment`) and fresh
memory from `allocate_and_mount_segment` (unmounted by `unmount_and_free_segment`). An id from
one record is unknown to the other call: -1, as the wheel answers (checked on 0.3.13). The
segment created by `setup` is in neither.

Ids are kvpool segment names (`<transfer endpoint>/<n>`); Mooncake's are "<high>-<low>" UUID
pairs. Both are opaque strings to a caller.

A graceful unmount (`grace_period_seconds > 0`) answers once the master has taken the drain
(one round trip), as Mooncake's, and drains the segment from a thread of its own with kvpool's graceful drain (`Store.drain_segment`,
src/kvpool/client/drain.py): the master places nothing new there at once (Mooncake's
GRACEFULLY_UNMOUNTING), moves out what must not be lost (pinned objects; last replicas when
the master keeps them), waits for read leases up to the grace period and unmounts it; the
segment stays readable until then. Mooncake instead drops the segment's replicas when the grace
period ends, so kvpool may unmount sooner (once nothing is leased) and keeps what it moved. A
second unmount of a segment being unmounted gracefully answers -600, the wheel's answer.
`close()` does not wait for a drain: the Store's own close unmounts whatever is left, which
ends the drain threads (`wait` joins them, bounded).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from kvpool.client import Store
from kvpool.codes import INTERNAL_ERROR, INVALID_PARAMS, OK, UNAVAILABLE_IN_CURRENT_STATUS
from kvpool.compat.mooncake import names
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import check_str, unsigned
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["PAGE", "Kind", "MountedSegments", "SegmentCalls"]

log = logging.getLogger(__name__)

REFUSED: Final = INTERNAL_ERROR
"""Mooncake answers -1 for an id it has no record of, and for every refused mount."""
BEING_UNMOUNTED: Final = INVALID_PARAMS
"""Mooncake's answer to a second unmount of a segment being unmounted gracefully."""
DRAIN_START_S: Final = 10.0
"""Seconds a graceful unmount waits for the master to take the drain (the RPC timeout)."""
PAGE: Final = 4096
"""kvpool segments are mapped memory, one page at least: smaller sizes are rounded up to it."""


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
        self._drains: dict[str, threading.Thread] = {}

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
                started = threading.Event()
                drain = threading.Thread(
                    target=self._drain,
                    args=(store, sid, grace_s, started),
                    name=f"kvpool-graceful-unmount-{sid}",
                    daemon=True,
                )
                self._drains[sid] = drain
                drain.start()
        if grace_s > 0:
            # As Mooncake's GRACEFULLY_UNMOUNTING: nothing is placed there once this returns.
            if not started.wait(DRAIN_START_S):
                log.warning("%s: the drain of %s has not started yet", kind.value, sid)
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

    def _drain(self, store: Store, sid: str, grace_s: int, started: threading.Event) -> None:
        try:
            reply = store.drain_segment(sid, grace=float(grace_s), on_started=started.set)
            log.info("graceful unmount of segment %s: %s", sid, reply.state or reply.code)
        except Exception as exc:
            # Closed meanwhile (close() unmounted it), or the master is unreachable: the
            # Store's close() unmounts what is left. Nothing to answer: the call returned.
            log.warning("graceful unmount of segment %s: %s", sid, exc)
        finally:
            started.set()  # also when it could not start: the caller stops waiting
            with self._lock:
                self._drains.pop(sid, None)
                self._graceful.discard(sid)
            self._on_gone(sid)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the pending graceful unmounts (tests; `join` after a close)."""
        with self._lock:
            drains = list(self._drains.values())
        for t in drains:
            if t is not threading.current_thread():
                t.join(timeout)

    def close(self) -> None:
        """Forget every record; drains in progress end when the Store closes (module
        docstring)."""
        with self._lock:
            self._kind.clear()
            self._graceful.clear()


class SegmentCalls(StoreBase):
    """The segment calls of `MooncakeDistributedStore` (module docstring)."""

    _mounted: MountedSegments

    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Mount bytes [offset, offset + size) of the file (or /dev/shm file) at `path` as one
        more segment of this store: `{"ret": 0, "segment_ids": [id]}`; size 0 mounts nothing
        (ret 0, no ids); a file that cannot be opened, a range past its end, an offset that is
        not page-aligned, or a size under one page answer ret -1. `protocol` and `location`
        are accepted and not needed."""
        check_str(path, "path")
        nbytes, off = unsigned(size, "size"), unsigned(offset, "offset")
        check_str(protocol, "protocol")
        check_str(location, "location")
        store = self._store
        if store is None:
            return {"ret": UNAVAILABLE_IN_CURRENT_STATUS, "segment_ids": []}
        if nbytes == 0:
            return {"ret": OK, "segment_ids": []}
        try:
            name = store.mount_segment(nbytes, path=path, offset=off)
        except Exception as exc:
            log.error("mount_segment(%r, %d, %d): %s", path, nbytes, off, exc)
            return {"ret": REFUSED, "segment_ids": []}
        self._adopt_segment(name, Kind.FILE)
        return {"ret": OK, "segment_ids": [name]}

    def allocate_and_mount_segment(
        self, size: int, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Allocate `size` bytes (rounded up to a page; Mooncake rounds to 16 MiB) and mount
        them as one more segment: `{"ret": 0, "segment_ids": [id], "allocated_size": n}`;
        size 0 or a failed allocation answer ret -1."""
        nbytes = unsigned(size, "size")
        check_str(protocol, "protocol")
        check_str(location, "location")
        store = self._store
        if store is None:
            return {"ret": UNAVAILABLE_IN_CURRENT_STATUS, "segment_ids": [], "allocated_size": 0}
        rounded = -(-nbytes // PAGE) * PAGE
        try:
            if rounded == 0:
                raise InvalidParams("size is 0")
            name = store.mount_segment(rounded)
        except Exception as exc:
            log.error("allocate_and_mount_segment(%d): %s", nbytes, exc)
            return {"ret": REFUSED, "segment_ids": [], "allocated_size": 0}
        self._adopt_segment(name, Kind.ALLOCATED)
        return {"ret": OK, "segment_ids": [name], "allocated_size": rounded}

    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmount segments of `mount_segment`, in order; 0, or the first failure (-1 for an id
        this store did not mount that way, -600 for one already being unmounted gracefully).
        A grace period answers at once and unmounts when it ends (module docstring)."""
        return self._unmount(segment_ids, grace_period_seconds, Kind.FILE)

    def unmount_and_free_segment(
        self, segment_ids: list[str], grace_period_seconds: int = 0
    ) -> int:
        """`unmount_segment` for the segments of `allocate_and_mount_segment`."""
        return self._unmount(segment_ids, grace_period_seconds, Kind.ALLOCATED)

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """0: a kvpool store has no local disk segment (the wheel answers 0 without one)."""
        unsigned(grace_period_seconds, "grace_period_seconds")
        return OK if self._store is not None else UNAVAILABLE_IN_CURRENT_STATUS

    def _unmount(self, segment_ids: object, grace: object, kind: Kind) -> int:
        if isinstance(segment_ids, str) or not isinstance(segment_ids, Sequence):
            raise TypeError(f"segment_ids: expected a list of str, got {type(segment_ids)}")
        ids = [check_str(sid, "segment_ids") for sid in segment_ids]
        grace_s = unsigned(grace, "grace_period_seconds")
        store = self._store
        if store is None:
            return UNAVAILABLE_IN_CURRENT_STATUS
        return self._mounted.unmount(store, ids, kind, grace_s)

    def _adopt_segment(self, name: str, kind: Kind) -> None:
        self._mounted.add(name, kind)
        # preferred_segments=[hostname] and replica descriptors name it after this store.
        names.add_segment(self._hostname, name)

    def _forget_segment(self, name: str) -> None:
        names.remove_segment(self._hostname, name)
