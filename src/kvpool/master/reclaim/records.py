"""The per-replica reclaim record (seed 001's KeyEvictInfo) and where it can be.

One `EvictInfo` exists for every COMPLETE memory replica the master knows about, a million of
them on a large pool, so it is built to be small: eight slots (96 bytes with the collector's
header), and it *is* its list node (`prev` / `next` links, no `OrderedDict` entry beside it).
`state`, `referenced` and `generation` are packed into one int, `flags`, which stays a cached
small int (< 256) as long as the generation is 0 (the master's case: there a generation is an
`ObjectMeta` identity). The record's shard is not stored: it is the shard of its key, and the
lists holding it know it. The master stores the head record of an object in
`ObjectMeta.reclaim` (see `ReclaimLists`' record index), so nothing else is kept per object.

Which fields may be touched by whom (the seed's "third difficulty"):

* `flags` (state and the `referenced` bit), `prev`, `next` change only inside the owning
  shard's critical section (`ReclaimLists.lock`): state and bit share one int, so even the bit
  is written under the lock (a write outside it could undo a concurrent state change).
* `epoch` is stamped under the lock when the record is isolated; only the pass holding the
  record under that epoch acts on it.
* `referenced` is an approximate heat bit: an access sets it even while the record is
  isolated (the pass then gives the record another trip).
* `key`, `replica_id`, `generation`, `size` never change after creation.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = ["EvictInfo", "K", "ListState"]

K = TypeVar("K")
"""The master's object key type (hashable; for the master service the `ObjectMeta` itself)."""


class ListState(Enum):
    """Where a record is. Only INACTIVE and ACTIVE records sit on a shard's lists."""

    INACTIVE = "inactive"
    """New or cooling down: the end of this list is where reclaim takes victims from."""
    ACTIVE = "active"
    """Proven hot (accessed twice while inactive): reclaim only demotes from here."""
    ISOLATED = "isolated"
    """Taken off its list by a reclaim pass (which owns it under `epoch`) for checking."""
    UNEVICTABLE = "unevictable"
    """Hard pinned: parked off the lists so that no pass scans it again (Linux's unevictable)."""
    MIGRATING = "migrating"
    """Pool mode: a swap-out is moving its bytes elsewhere; freed when the move reports back."""
    REMOVED = "removed"
    """Gone from the engine (object removed, replica evicted or found stale). Terminal."""
    SOFT_PINNED = "soft_pinned"
    """Cache mode, soft-pinned objects evictable last: parked off inactive so that passes
    look at it only once every shard's unpinned records fell short (or its pin ended)."""


# flags = referenced (bit 0) | state index (bits 1-3) | generation << 4.
_STATES: tuple[ListState, ...] = tuple(ListState)
_STATE_BITS: dict[ListState, int] = {s: i << 1 for i, s in enumerate(_STATES)}
REF = 1
STATE_MASK = 0b1110
INACTIVE_BITS = _STATE_BITS[ListState.INACTIVE]
_INACTIVE = ListState.INACTIVE
ACTIVE_BITS = _STATE_BITS[ListState.ACTIVE]
ISOLATED_BITS = _STATE_BITS[ListState.ISOLATED]
UNEVICTABLE_BITS = _STATE_BITS[ListState.UNEVICTABLE]
MIGRATING_BITS = _STATE_BITS[ListState.MIGRATING]
REMOVED_BITS = _STATE_BITS[ListState.REMOVED]
SOFT_PINNED_BITS = _STATE_BITS[ListState.SOFT_PINNED]


class EvictInfo(Generic[K]):
    """Reclaim state of one COMPLETE memory replica of one generation of an object.

    `generation` distinguishes puts of the same key (put → remove → put): a record whose
    (key, generation, replica_id) no longer matches the metadata is stale and is dropped by the
    next pass that meets it. `epoch` is the shard's isolation epoch at which the record was last
    isolated; the pass holding that epoch is the only one allowed to put it back. `replica_id`
    is any value that identifies the replica among the object's (compared with `==`): an int in
    `SimulatedPool`, the `Replica` object itself in the master (no int to allocate per record).
    `shard` is accepted for compatibility and not stored (the lists holding a record know it).
    Hashed and compared by identity.
    """

    __slots__ = ("epoch", "flags", "key", "next", "prev", "replica_id", "sibling", "size")

    def __init__(  # noqa: PLR0917
        self,
        key: K,
        replica_id: Any,
        generation: int,
        size: int,
        shard: int = 0,
        state: ListState = ListState.INACTIVE,
        referenced: bool = False,
        epoch: int = 0,
        sibling: EvictInfo[K] | None = None,
    ) -> None:
        del shard
        self.key = key
        self.replica_id = replica_id
        self.size = size
        # The common state without a dict lookup: hashing an Enum member runs Python code,
        # and a record is made for every completed replica.
        bits = INACTIVE_BITS if state is _INACTIVE else _STATE_BITS[state]
        self.flags = (generation << 4) | bits | (REF if referenced else 0)
        self.epoch = epoch
        self.sibling = sibling
        """Next record of the same key and generation (other replicas of the object)."""
        self.prev: EvictInfo[K] | None = None
        """Towards the list's head (newer); None while off any list."""
        self.next: EvictInfo[K] | None = None
        """Towards the list's tail (older, the next victim); None while off any list."""

    @property
    def generation(self) -> int:
        return self.flags >> 4

    @property
    def state(self) -> ListState:
        return _STATES[(self.flags & STATE_MASK) >> 1]

    @state.setter
    def state(self, value: ListState) -> None:
        self.flags = (self.flags & ~STATE_MASK) | _STATE_BITS[value]

    @property
    def referenced(self) -> bool:
        return bool(self.flags & REF)

    @referenced.setter
    def referenced(self, value: bool) -> None:
        self.flags = (self.flags | REF) if value else (self.flags & ~REF)

    def __repr__(self) -> str:
        rid = self.replica_id
        return (
            f"EvictInfo({self.key!r}, r{rid if isinstance(rid, int) else hex(id(rid))}, "
            f"g{self.generation}, {self.size} B, {self.state.value}"
            f"{', ref' if self.referenced else ''})"
        )
