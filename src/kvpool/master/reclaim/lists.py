"""One shard's active and inactive lists (seed 001's ShardEvictInfo) and their critical section.

Each list is an intrusive doubly linked ring through the records' own `prev` / `next` slots,
closed by a sentinel record: the *head* (most recently inserted) is `sentinel.next`, the *tail*
(next victim) `sentinel.prev`. Every operation is O(1) and allocates nothing: insert at head or
tail, unlink, pop from the tail. (An `OrderedDict` keyed by the record did the same at about
150 bytes per entry beside the record; at a million replicas that was most of reclaim's memory.)

Everything here runs under `lock` and does no I/O and no metadata lookup: that is the whole
point of the design. The slow checks happen in `engine.py`, outside this critical section, on
records that were *isolated* first (taken off the list, state ISOLATED, stamped with a fresh
`epoch`). While isolated, a record may still be accessed (its `referenced` bit is set) or
removed (its state becomes REMOVED), but it is never relinked by anyone except the pass that
holds its epoch, and that pass relinks it only if it is still ISOLATED under that epoch.

The record index (`RecordIndex`) maps each key to the head record of its *current* generation
(a chain through `sibling`, one per memory replica). By default it is a dict per shard; the
master passes one that keeps the head record in `ObjectMeta.reclaim`, so no per-object dict
entry exists at all. A record of an older generation that lingers on a list after the key was
put again is no longer indexed; the next pass that meets it finds it stale and drops it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Generic, Protocol

from kvpool.master.reclaim.records import (
    ACTIVE_BITS,
    INACTIVE_BITS,
    ISOLATED_BITS,
    MIGRATING_BITS,
    REF,
    REMOVED_BITS,
    SOFT_PINNED_BITS,
    STATE_MASK,
    UNEVICTABLE_BITS,
    EvictInfo,
    K,
    ListState,
)

__all__ = ["DictRecordIndex", "ReclaimLists", "RecordIndex", "ShardUsage"]

_NOT_STATE = ~STATE_MASK
# A record built slot by slot on the hot path (`add_first`): no `__init__` frame.
_new_record = object.__new__
_NOT_REF = ~REF


class RecordIndex(Protocol[K]):
    """Where the head record of a key's current generation is kept (see the module docstring).

    Called only under the owning shard's lock. `get` answers None for an unknown key."""

    def get(self, key: K) -> EvictInfo[K] | None: ...

    def __setitem__(self, key: K, rec: EvictInfo[K]) -> None: ...

    def __delitem__(self, key: K) -> None: ...


class DictRecordIndex(dict[Any, Any]):
    """The default `RecordIndex`: a dict key -> head record (one per shard)."""


class ShardUsage:
    """Resident bytes and records of every shard, one slot each, shared with the engine.

    Each shard writes only its own slots (under its own lock), so the engine can sum or weigh
    all shards with one C-level pass over a list instead of visiting every shard object.
    """

    __slots__ = ("bytes", "count")

    def __init__(self, num_shards: int) -> None:
        self.bytes = [0] * num_shards
        self.count = [0] * num_shards


def _ring() -> EvictInfo[Any]:
    s: EvictInfo[Any] = EvictInfo(None, None, 0, 0)
    s.prev = s.next = s
    return s


def _push_head(s: EvictInfo[K], rec: EvictInfo[K]) -> None:
    first = s.next
    assert first is not None
    rec.prev = s
    rec.next = first
    first.prev = rec
    s.next = rec


def _push_tail(s: EvictInfo[K], rec: EvictInfo[K]) -> None:
    last = s.prev
    assert last is not None
    rec.next = s
    rec.prev = last
    last.next = rec
    s.prev = rec


def _unlink(rec: EvictInfo[K]) -> None:
    p, n = rec.prev, rec.next
    assert p is not None and n is not None
    p.next = n
    n.prev = p
    rec.prev = rec.next = None


def _walk(s: EvictInfo[K]) -> Iterator[EvictInfo[K]]:
    """Tail (next victim) to head."""
    node = s.prev
    while node is not s and node is not None:
        yield node
        node = node.prev


class ReclaimLists(Generic[K]):
    """Active/inactive lists, unevictable set, soft-pinned ring and key index of one metadata
    shard.

    The soft-pinned ring holds records a pass found soft pinned in cache mode, when those may
    be evicted last: parked there, they cost later passes nothing until every shard's unpinned
    records fell short, and they go back to inactive when their pin ends (`unpark`)."""

    __slots__ = (
        "_active",
        "_by_key",
        "_inactive",
        "_n_active",
        "_n_inactive",
        "_n_soft",
        "_n_unevictable",
        "_soft",
        "_unevictable",
        "active_bytes",
        "epoch",
        "inactive_bytes",
        "lock",
        "shard",
        "soft_pinned_bytes",
        "usage",
    )

    def __init__(
        self,
        shard: int,
        usage: ShardUsage | None = None,
        index: RecordIndex[K] | None = None,
    ) -> None:
        self.shard = shard
        self.usage = usage if usage is not None else ShardUsage(shard + 1)
        self.lock = threading.Lock()
        self._active: EvictInfo[K] = _ring()
        self._inactive: EvictInfo[K] = _ring()
        self._unevictable: EvictInfo[K] = _ring()
        self._soft: EvictInfo[K] = _ring()
        self._n_active = 0
        self._n_inactive = 0
        self._n_unevictable = 0
        self._n_soft = 0
        self._by_key: RecordIndex[K] = index if index is not None else DictRecordIndex()
        self.epoch = 0
        self.active_bytes = 0
        self.inactive_bytes = 0
        self.soft_pinned_bytes = 0

    # ------------------------------------------------------------------ online path, O(1)

    def add(self, rec: EvictInfo[K], unevictable: bool = False) -> EvictInfo[K]:
        """Index `rec` and put it at the head of inactive (or park it when unevictable).

        Idempotent: when the key's current generation already has a record for the same
        replica, that record is returned and `rec` is ignored. A record of a newer generation
        (generations only grow per key) replaces the index entry; the older generation's
        records stay where they are, stale.
        """
        with self.lock:
            head = self._by_key.get(rec.key)
            gen = rec.flags >> 4
            if head is not None and head.flags >> 4 == gen:
                node: EvictInfo[K] | None = head
                while node is not None:
                    if node.replica_id == rec.replica_id:
                        return node
                    node = node.sibling
                rec.sibling = head
            if head is None or gen >= head.flags >> 4:
                self._by_key[rec.key] = rec
            # else: a late report of an older generation (a stale reference relinked it). It is
            # listed but not indexed, and the next pass that meets it drops it as stale.
            self.usage.bytes[self.shard] += rec.size
            self.usage.count[self.shard] += 1
            if unevictable:
                rec.flags = (rec.flags & _NOT_STATE) | UNEVICTABLE_BITS
                _push_head(self._unevictable, rec)
                self._n_unevictable += 1
            else:
                rec.flags = (rec.flags & _NOT_STATE) | INACTIVE_BITS
                s = self._inactive  # _push_head, inlined: this runs on every PutEnd
                first = s.next
                assert first is not None
                rec.prev = s
                rec.next = first
                first.prev = rec
                s.next = rec
                self._n_inactive += 1
                self.inactive_bytes += rec.size
            return rec

    def add_first(self, key: K, replica_id: Any, size: int) -> EvictInfo[K] | None:
        """`add` of an evictable generation-0 record for a `key` that has no record yet (a
        new object's one replica: every PutCommit and PutEnd), built and linked in this one
        call; None (nothing done) when `key` has a record already: the caller takes `add`."""
        with self.lock:
            index = self._by_key
            if index.get(key) is not None:
                return None
            rec: EvictInfo[K] = _new_record(EvictInfo)
            rec.key = key
            rec.replica_id = replica_id
            rec.size = size
            rec.flags = INACTIVE_BITS
            rec.epoch = 0
            rec.sibling = None
            index[key] = rec
            shard = self.shard
            usage = self.usage
            usage.bytes[shard] += size
            usage.count[shard] += 1
            s = self._inactive  # _push_head, inlined
            first = s.next
            assert first is not None
            rec.prev = s
            rec.next = first
            first.prev = rec
            s.next = rec
            self._n_inactive += 1
            self.inactive_bytes += size
            return rec

    def mark_accessed(self, key: K) -> int:
        """One access to `key` (Linux's folio_mark_accessed); returns how many records it promoted.

        First access of an inactive record only sets `referenced`; a second access while it is
        still inactive moves it to the head of active. An isolated record only gets the bit.
        """
        promoted = 0
        with self.lock:
            rec = self._by_key.get(key)
            while rec is not None:
                flags = rec.flags
                if flags & (STATE_MASK | REF) == INACTIVE_BITS | REF:
                    _unlink(rec)
                    self._n_inactive -= 1
                    self.inactive_bytes -= rec.size
                    _push_head(self._active, rec)
                    self._n_active += 1
                    self.active_bytes += rec.size
                    rec.flags = flags & _NOT_STATE & _NOT_REF | ACTIVE_BITS
                    promoted += 1
                elif not flags & REF:
                    rec.flags = flags | REF
                rec = rec.sibling
        return promoted

    def remove(self, key: K, generation: int | None = None) -> list[EvictInfo[K]]:
        """Unlink every record of `key` (of `generation`, when given); idempotent.

        Returns the records that this call removed (empty when there was nothing to remove).
        """
        with self.lock:
            head = self._by_key.get(key)
            if head is None or (generation is not None and head.flags >> 4 != generation):
                return []
            del self._by_key[key]
            removed: list[EvictInfo[K]] = []
            rec: EvictInfo[K] | None = head
            while rec is not None:
                nxt = rec.sibling
                rec.sibling = None
                if self._retire_locked(rec):
                    removed.append(rec)
                rec = nxt
            return removed

    def clear_referenced(self, rec: EvictInfo[K]) -> None:
        """Spend a record's referenced bit (the bit shares `flags` with the state, so every
        write of it happens under the lock)."""
        with self.lock:
            rec.flags &= _NOT_REF

    def remove_replica(self, key: K, replica_id: Any) -> bool:
        """Unlink the current generation's record of one replica of `key`; idempotent."""
        with self.lock:
            rec = self._by_key.get(key)
            while rec is not None and rec.replica_id != replica_id:
                rec = rec.sibling
            if rec is None:
                return False
            self._unindex_locked(rec)
            return self._retire_locked(rec)

    # ------------------------------------------------------------------ reclaim side

    def isolate_inactive(self, n: int) -> tuple[int, list[EvictInfo[K]]]:
        """Take up to `n` records off the tail of inactive (oldest first) under a new epoch."""
        with self.lock:
            if not self._n_inactive:
                return self.epoch, []
            epoch, batch, nbytes = self._isolate_locked(self._inactive, min(n, self._n_inactive))
            self._n_inactive -= len(batch)
            self.inactive_bytes -= nbytes
            return epoch, batch

    def isolate_soft_pinned(self, n: int) -> tuple[int, list[EvictInfo[K]]]:
        """Take up to `n` records off the tail of the soft-pinned ring (parked longest first)
        under a new epoch."""
        with self.lock:
            if not self._n_soft:
                return self.epoch, []
            epoch, batch, nbytes = self._isolate_locked(self._soft, min(n, self._n_soft))
            self._n_soft -= len(batch)
            self.soft_pinned_bytes -= nbytes
            return epoch, batch

    def putback(
        self, recs: list[EvictInfo[K]], epoch: int, where: ListState, *, at_tail: bool = False
    ) -> int:
        """Relink records isolated under `epoch` (skipping any removed meanwhile).

        `at_tail=True` restores records a pass did not get to, in their old order, so that the
        next pass meets them first; otherwise they go to the head (rotated: looked at, kept).
        """
        assert where in (ListState.ACTIVE, ListState.INACTIVE, ListState.SOFT_PINNED)
        if not recs:
            return 0
        active = where is ListState.ACTIVE
        soft = where is ListState.SOFT_PINNED
        s = self._active if active else self._soft if soft else self._inactive
        bits = ACTIVE_BITS if active else SOFT_PINNED_BITS if soft else INACTIVE_BITS
        n = 0
        nbytes = 0
        with self.lock:
            for rec in reversed(recs) if at_tail else recs:
                if rec.flags & STATE_MASK != ISOLATED_BITS or rec.epoch != epoch:
                    continue
                rec.flags = (rec.flags & _NOT_STATE) | bits
                if at_tail:
                    _push_tail(s, rec)
                else:
                    _push_head(s, rec)
                nbytes += rec.size
                n += 1
            if active:
                self.active_bytes += nbytes
                self._n_active += n
            elif soft:
                self.soft_pinned_bytes += nbytes
                self._n_soft += n
            else:
                self.inactive_bytes += nbytes
                self._n_inactive += n
        return n

    def forget(self, rec: EvictInfo[K]) -> bool:
        """Retire `rec` for good (evicted or stale), wherever it is; False if already gone."""
        with self.lock:
            self._unindex_locked(rec)
            return self._retire_locked(rec)

    def park_unevictable(self, rec: EvictInfo[K], epoch: int) -> bool:
        """Move an isolated record found hard pinned off the lists for good."""
        with self.lock:
            if rec.flags & STATE_MASK != ISOLATED_BITS or rec.epoch != epoch:
                return False
            rec.flags = (rec.flags & _NOT_STATE) | UNEVICTABLE_BITS
            _push_head(self._unevictable, rec)
            self._n_unevictable += 1
            return True

    def park_soft_pinned(self, rec: EvictInfo[K], epoch: int) -> bool:
        """Move an isolated record found soft pinned (cache mode) to the soft-pinned ring."""
        return self.putback([rec], epoch, ListState.SOFT_PINNED) == 1

    def unpark(self, key: K) -> int:
        """`key`'s soft pin ended: its parked records go to the head of inactive, among the
        unpinned records again; returns how many moved. O(replicas of the key)."""
        moved = 0
        with self.lock:
            rec = self._by_key.get(key)
            while rec is not None:
                if rec.flags & STATE_MASK == SOFT_PINNED_BITS:
                    _unlink(rec)
                    self._n_soft -= 1
                    self.soft_pinned_bytes -= rec.size
                    rec.flags = (rec.flags & _NOT_STATE) | INACTIVE_BITS
                    _push_head(self._inactive, rec)
                    self._n_inactive += 1
                    self.inactive_bytes += rec.size
                    moved += 1
                rec = rec.sibling
        return moved

    def start_migration(self, rec: EvictInfo[K], epoch: int) -> bool:
        """Hand an isolated record to a swap-out; it stays resident until the move reports."""
        with self.lock:
            if rec.flags & STATE_MASK != ISOLATED_BITS or rec.epoch != epoch:
                return False
            rec.flags = (rec.flags & _NOT_STATE) | MIGRATING_BITS
            return True

    def end_migration(self, rec: EvictInfo[K], moved: bool) -> bool:
        """A swap-out reported: retire the record (moved) or put it back at the inactive head.

        Returns True when the record was retired by this call.
        """
        with self.lock:
            if rec.flags & STATE_MASK != MIGRATING_BITS:
                return False
            if moved:
                self._unindex_locked(rec)
                return self._retire_locked(rec)
            rec.flags = (rec.flags & _NOT_STATE) | INACTIVE_BITS
            _push_head(self._inactive, rec)
            self._n_inactive += 1
            self.inactive_bytes += rec.size
            return False

    def shrink_active(self, nbytes: int, max_scan: int, chunk: int) -> tuple[int, int]:
        """Demote about `nbytes` of unreferenced records from the tail of active to inactive.

        Referenced records get a second chance (bit cleared, back to the active head). Looks at
        no more than `max_scan` records, in chunks of `chunk` per critical section so that the
        online path is never held up for long. Nothing here needs the metadata, so records are
        handled in place rather than isolated. Returns (demoted bytes, records scanned).
        """
        demoted = 0
        scanned = 0
        s_act, s_inact = self._active, self._inactive
        while demoted < nbytes and scanned < max_scan:
            with self.lock:
                if not self._n_active:
                    break
                for _ in range(min(chunk, max_scan - scanned, self._n_active)):
                    rec = s_act.prev
                    assert rec is not None and rec is not s_act
                    _unlink(rec)
                    scanned += 1
                    flags = rec.flags
                    if flags & REF:
                        rec.flags = flags & _NOT_REF
                        _push_head(s_act, rec)
                        continue
                    self._n_active -= 1
                    self.active_bytes -= rec.size
                    rec.flags = (flags & _NOT_STATE) | INACTIVE_BITS
                    _push_head(s_inact, rec)
                    self._n_inactive += 1
                    self.inactive_bytes += rec.size
                    demoted += rec.size
                    if demoted >= nbytes:
                        break
        return demoted, scanned

    # ------------------------------------------------------------------ views

    @property
    def resident_bytes(self) -> int:
        """Bytes of every record not REMOVED (on a list, isolated, parked or migrating)."""
        return self.usage.bytes[self.shard]

    @property
    def resident_count(self) -> int:
        """Number of those records."""
        return self.usage.count[self.shard]

    @property
    def active_len(self) -> int:
        """Records on active (a size hint: read without the lock)."""
        return self._n_active

    @property
    def inactive_len(self) -> int:
        """Records on inactive (a size hint, like `active_len`)."""
        return self._n_inactive

    @property
    def soft_pinned_len(self) -> int:
        """Records parked on the soft-pinned ring (a size hint, like `active_len`)."""
        return self._n_soft

    def counts(self) -> tuple[int, int, int]:
        """(active, inactive, unevictable) record counts."""
        return self._n_active, self._n_inactive, self._n_unevictable

    def records_of(self, key: K) -> list[EvictInfo[K]]:
        """The indexed (current generation) records of `key`."""
        with self.lock:
            out: list[EvictInfo[K]] = []
            rec = self._by_key.get(key)
            while rec is not None:
                out.append(rec)
                rec = rec.sibling
            return out

    def inactive_order(self) -> list[EvictInfo[K]]:
        """Inactive records from tail (next victim) to head; for tests and status."""
        with self.lock:
            return list(_walk(self._inactive))

    def active_order(self) -> list[EvictInfo[K]]:
        """Active records from tail to head; for tests and status."""
        with self.lock:
            return list(_walk(self._active))

    def soft_pinned_order(self) -> list[EvictInfo[K]]:
        """Parked soft-pinned records from tail (next to look at) to head; for tests."""
        with self.lock:
            return list(_walk(self._soft))

    # ------------------------------------------------------------------ internals (lock held)

    def _isolate_locked(self, s: EvictInfo[K], n: int) -> tuple[int, list[EvictInfo[K]], int]:
        """Unlink `n` (> 0, at most the ring's length) records off the tail of ring `s`, mark
        them ISOLATED under a new epoch; (epoch, records, their bytes). The caller adjusts the
        ring's counters."""
        self.epoch += 1
        epoch = self.epoch
        batch: list[EvictInfo[K]] = []
        nbytes = 0
        for _ in range(n):
            rec = s.prev
            assert rec is not None and rec is not s
            _unlink(rec)
            rec.flags = (rec.flags & _NOT_STATE) | ISOLATED_BITS
            rec.epoch = epoch
            nbytes += rec.size
            batch.append(rec)
        return epoch, batch, nbytes

    def _retire_locked(self, rec: EvictInfo[K]) -> bool:
        flags = rec.flags
        state = flags & STATE_MASK
        if state == REMOVED_BITS:
            return False
        if state == INACTIVE_BITS:
            _unlink(rec)
            self._n_inactive -= 1
            self.inactive_bytes -= rec.size
        elif state == ACTIVE_BITS:
            _unlink(rec)
            self._n_active -= 1
            self.active_bytes -= rec.size
        elif state == UNEVICTABLE_BITS:
            _unlink(rec)
            self._n_unevictable -= 1
        elif state == SOFT_PINNED_BITS:
            _unlink(rec)
            self._n_soft -= 1
            self.soft_pinned_bytes -= rec.size
        # ISOLATED and MIGRATING records are owned by a pass or a swap-out, which sees REMOVED.
        rec.flags = (flags & _NOT_STATE) | REMOVED_BITS
        self.usage.bytes[self.shard] -= rec.size
        self.usage.count[self.shard] -= 1
        return True

    def _unindex_locked(self, rec: EvictInfo[K]) -> None:
        head = self._by_key.get(rec.key)
        if head is None:
            return
        if head is rec:
            if rec.sibling is None:
                del self._by_key[rec.key]
            else:
                self._by_key[rec.key] = rec.sibling
            rec.sibling = None
            return
        prev = head
        while prev.sibling is not None:
            if prev.sibling is rec:
                prev.sibling = rec.sibling
                rec.sibling = None
                return
            prev = prev.sibling
