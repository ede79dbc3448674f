"""The per-replica reclaim record (seed 001's KeyEvictInfo) and where it can be.

One `EvictInfo` exists for every COMPLETE memory replica the master knows about. It is small
(slotted, hashed by identity so it can key an `OrderedDict` list node) because there is one per
resident replica, a million of them on a large pool.

Which fields may be touched by whom (the seed's "third difficulty"):

* `state` and `epoch` change only inside the owning shard's critical section
  (`ReclaimLists.lock`), or by the reclaim pass that holds the record isolated under that epoch.
* `referenced` is an approximate heat bit: an access may set it at any time, even while the
  record is isolated, without the list lock mattering for correctness.
* `key`, `replica_id`, `generation`, `size`, `shard` never change after creation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

__all__ = ["EvictInfo", "K", "ListState"]

K = TypeVar("K")
"""The master's object key type (hashable; for the master service a (tenant, key) pair)."""


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


@dataclass(slots=True, eq=False)
class EvictInfo(Generic[K]):
    """Reclaim state of one COMPLETE memory replica of one generation of an object.

    `generation` distinguishes puts of the same key (put → remove → put): a record whose
    (key, generation, replica_id) no longer matches the metadata is stale and is dropped by the
    next pass that meets it. `epoch` is the shard's isolation epoch at which the record was last
    isolated; the pass holding that epoch is the only one allowed to put it back.
    """

    key: K
    replica_id: int
    generation: int
    size: int
    shard: int
    state: ListState = ListState.INACTIVE
    referenced: bool = False
    epoch: int = 0
    sibling: EvictInfo[K] | None = None
    """Next record of the same key and generation (other replicas of the object)."""

    def __repr__(self) -> str:
        return (
            f"EvictInfo({self.key!r}, r{self.replica_id}, g{self.generation}, {self.size} B, "
            f"shard {self.shard}, {self.state.value}{', ref' if self.referenced else ''})"
        )
