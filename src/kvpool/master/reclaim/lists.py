"""One shard's active and inactive lists (seed 001's ShardEvictInfo) and their critical section.

Each list is an `OrderedDict` used as an intrusive LRU: the *head* (most recently inserted) is
the dict's end, the *tail* (next victim) its start. Every operation is O(1): insert at head,
`move_to_end`, `popitem(last=False)` from the tail, `pop` to unlink. A plain `dict` would keep
order too, but popping its oldest entry degrades after many deletions; `OrderedDict` does not.

Everything here runs under `lock` and does no I/O and no metadata lookup: that is the whole
point of the design. The slow checks happen in `engine.py`, outside this critical section, on
records that were *isolated* first (taken off the list, state ISOLATED, stamped with a fresh
`epoch`). While isolated, a record may still be accessed (its `referenced` bit is set) or
removed (its state becomes REMOVED), but it is never relinked by anyone except the pass that
holds its epoch, and that pass relinks it only if it is still ISOLATED under that epoch.

`by_key` indexes the records of each key's *current* generation (a chain through `sibling`, one
per memory replica). A record of an older generation that lingers on a list after the key was
put again is no longer indexed; the next pass that meets it finds it stale and drops it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic

from kvpool.master.reclaim.records import EvictInfo, K, ListState

__all__ = ["ReclaimLists", "ShardUsage"]


class ShardUsage:
    """Resident bytes and records of every shard, one slot each, shared with the engine.

    Each shard writes only its own slots (under its own lock), so the engine can sum or weigh
    all shards with one C-level pass over a list instead of visiting every shard object.
    """

    __slots__ = ("bytes", "count")

    def __init__(self, num_shards: int) -> None:
        self.bytes = [0] * num_shards
        self.count = [0] * num_shards


class ReclaimLists(Generic[K]):
    """Active/inactive lists, unevictable set and key index of one metadata shard."""

    __slots__ = (
        "_active",
        "_by_key",
        "_inactive",
        "_unevictable",
        "active_bytes",
        "epoch",
        "inactive_bytes",
        "lock",
        "shard",
        "usage",
    )

    def __init__(self, shard: int, usage: ShardUsage | None = None) -> None:
        self.shard = shard
        self.usage = usage if usage is not None else ShardUsage(shard + 1)
        self.lock = threading.Lock()
        self._active: OrderedDict[EvictInfo[K], None] = OrderedDict()
        self._inactive: OrderedDict[EvictInfo[K], None] = OrderedDict()
        self._unevictable: dict[EvictInfo[K], None] = {}
        self._by_key: dict[K, EvictInfo[K]] = {}
        self.epoch = 0
        self.active_bytes = 0
        self.inactive_bytes = 0

    # ------------------------------------------------------------------ online path, O(1)

    def add(self, rec: EvictInfo[K], *, unevictable: bool = False) -> EvictInfo[K]:
        """Index `rec` and put it at the head of inactive (or park it when unevictable).

        Idempotent: when the key's current generation already has a record for the same
        replica, that record is returned and `rec` is ignored. A record of a newer generation
        (generations only grow per key) replaces the index entry; the older generation's
        records stay where they are, stale.
        """
        with self.lock:
            head = self._by_key.get(rec.key)
            if head is not None and head.generation == rec.generation:
                node: EvictInfo[K] | None = head
                while node is not None:
                    if node.replica_id == rec.replica_id:
                        return node
                    node = node.sibling
                rec.sibling = head
            if head is None or rec.generation >= head.generation:
                self._by_key[rec.key] = rec
            # else: a late report of an older generation (a stale reference relinked it). It is
            # listed but not indexed, and the next pass that meets it drops it as stale.
            self.usage.bytes[self.shard] += rec.size
            self.usage.count[self.shard] += 1
            if unevictable:
                rec.state = ListState.UNEVICTABLE
                self._unevictable[rec] = None
            else:
                rec.state = ListState.INACTIVE
                self._inactive[rec] = None
                self.inactive_bytes += rec.size
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
                if rec.state is ListState.INACTIVE and rec.referenced:
                    del self._inactive[rec]
                    self.inactive_bytes -= rec.size
                    self._active[rec] = None
                    self.active_bytes += rec.size
                    rec.state = ListState.ACTIVE
                    rec.referenced = False
                    promoted += 1
                else:
                    rec.referenced = True
                rec = rec.sibling
        return promoted

    def remove(self, key: K, generation: int | None = None) -> list[EvictInfo[K]]:
        """Unlink every record of `key` (of `generation`, when given); idempotent.

        Returns the records that this call removed (empty when there was nothing to remove).
        """
        with self.lock:
            head = self._by_key.get(key)
            if head is None or (generation is not None and head.generation != generation):
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

    # ------------------------------------------------------------------ reclaim side

    def isolate_inactive(self, n: int) -> tuple[int, list[EvictInfo[K]]]:
        """Take up to `n` records off the tail of inactive (oldest first) under a new epoch."""
        with self.lock:
            if not self._inactive:
                return self.epoch, []
            self.epoch += 1
            epoch = self.epoch
            batch: list[EvictInfo[K]] = []
            pop = self._inactive.popitem
            for _ in range(min(n, len(self._inactive))):
                rec, _none = pop(last=False)
                rec.state = ListState.ISOLATED
                rec.epoch = epoch
                self.inactive_bytes -= rec.size
                batch.append(rec)
            return epoch, batch

    def putback(
        self, recs: list[EvictInfo[K]], epoch: int, where: ListState, *, at_tail: bool = False
    ) -> int:
        """Relink records isolated under `epoch` (skipping any removed meanwhile).

        `at_tail=True` restores records a pass did not get to, in their old order, so that the
        next pass meets them first; otherwise they go to the head (rotated: looked at, kept).
        """
        assert where in (ListState.ACTIVE, ListState.INACTIVE)
        if not recs:
            return 0
        lst = self._active if where is ListState.ACTIVE else self._inactive
        n = 0
        with self.lock:
            for rec in reversed(recs) if at_tail else recs:
                if rec.state is not ListState.ISOLATED or rec.epoch != epoch:
                    continue
                rec.state = where
                lst[rec] = None
                if at_tail:
                    lst.move_to_end(rec, last=False)
                if where is ListState.ACTIVE:
                    self.active_bytes += rec.size
                else:
                    self.inactive_bytes += rec.size
                n += 1
        return n

    def forget(self, rec: EvictInfo[K]) -> bool:
        """Retire `rec` for good (evicted or stale), wherever it is; False if already gone."""
        with self.lock:
            self._unindex_locked(rec)
            return self._retire_locked(rec)

    def park_unevictable(self, rec: EvictInfo[K], epoch: int) -> bool:
        """Move an isolated record found hard pinned off the lists for good."""
        with self.lock:
            if rec.state is not ListState.ISOLATED or rec.epoch != epoch:
                return False
            rec.state = ListState.UNEVICTABLE
            self._unevictable[rec] = None
            return True

    def start_migration(self, rec: EvictInfo[K], epoch: int) -> bool:
        """Hand an isolated record to a swap-out; it stays resident until the move reports."""
        with self.lock:
            if rec.state is not ListState.ISOLATED or rec.epoch != epoch:
                return False
            rec.state = ListState.MIGRATING
            return True

    def end_migration(self, rec: EvictInfo[K], moved: bool) -> bool:
        """A swap-out reported: retire the record (moved) or put it back at the inactive head.

        Returns True when the record was retired by this call.
        """
        with self.lock:
            if rec.state is not ListState.MIGRATING:
                return False
            if moved:
                self._unindex_locked(rec)
                return self._retire_locked(rec)
            rec.state = ListState.INACTIVE
            self._inactive[rec] = None
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
        while demoted < nbytes and scanned < max_scan:
            with self.lock:
                if not self._active:
                    break
                pop = self._active.popitem
                for _ in range(min(chunk, max_scan - scanned, len(self._active))):
                    rec, _none = pop(last=False)
                    scanned += 1
                    if rec.referenced:
                        rec.referenced = False
                        self._active[rec] = None
                        continue
                    self.active_bytes -= rec.size
                    rec.state = ListState.INACTIVE
                    self._inactive[rec] = None
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
        """Records on active (`len` of a dict is atomic: no lock needed for a size hint)."""
        return len(self._active)

    @property
    def inactive_len(self) -> int:
        """Records on inactive (a size hint, like `active_len`)."""
        return len(self._inactive)

    def counts(self) -> tuple[int, int, int]:
        """(active, inactive, unevictable) record counts."""
        return len(self._active), len(self._inactive), len(self._unevictable)

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
            return list(self._inactive)

    def active_order(self) -> list[EvictInfo[K]]:
        """Active records from tail to head; for tests and status."""
        with self.lock:
            return list(self._active)

    # ------------------------------------------------------------------ internals (lock held)

    def _retire_locked(self, rec: EvictInfo[K]) -> bool:
        state = rec.state
        if state is ListState.REMOVED:
            return False
        if state is ListState.INACTIVE:
            del self._inactive[rec]
            self.inactive_bytes -= rec.size
        elif state is ListState.ACTIVE:
            del self._active[rec]
            self.active_bytes -= rec.size
        elif state is ListState.UNEVICTABLE:
            del self._unevictable[rec]
        # ISOLATED and MIGRATING records are owned by a pass or a swap-out, which sees REMOVED.
        rec.state = ListState.REMOVED
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
