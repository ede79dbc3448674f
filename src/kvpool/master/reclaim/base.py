"""The contract between the reclaim engine and whoever owns the object metadata.

The engine keeps heat (lists) and chooses candidates; it knows nothing about objects, leases or
segments. Everything it needs to know about one candidate it asks through `ReclaimTarget`, and
everything it decides it carries out through it. The master implements it on its metadata
(`adapter.py`); `simulated.py` implements it on an in-memory table for tests and benchmarks.

Threading and re-entrancy (for every method): called by the thread running a reclaim pass,
which in the master is the event loop that owns the metadata, never under a reclaim-list lock.
So an implementation may call back into the engine (`on_remove` when a drop erases the
object, `on_complete` for a swap-out's new replica) without deadlock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Generic

from kvpool.master.reclaim.records import EvictInfo, K

__all__ = ["ReclaimTarget", "Verdict"]


class Verdict(Enum):
    """What the metadata says about one candidate replica, checked outside the list lock."""

    STALE = "stale"
    """The record no longer matches: object gone, other generation, replica gone or not
    COMPLETE. The engine drops the record (and frees nothing: the bytes are not its any more)."""
    HARD_PINNED = "hard_pinned"
    """Never evicted (still removable). The engine parks the record off the lists."""
    LEASED = "leased"
    """A read lease is live: never evicted under a reader. Kept, rotated to the list head."""
    BUSY = "busy"
    """A transfer is writing or reading this replica (refcount > 0). Kept, rotated."""
    SOFT_PINNED = "soft_pinned"
    """The object has a live soft pin. Cache mode: evicted last, only if allowed. Pool mode:
    swapped out (moved, never dropped)."""
    PRIMARY = "primary"
    """Evictable, and this replica is the object's primary (losing it may lose the object).
    Cache mode: dropped. Pool mode: swapped out first."""
    DROPPABLE = "droppable"
    """Evictable, not soft-pinned and not primary: dropped in either mode."""


class ReclaimTarget(ABC, Generic[K]):
    """What the engine needs from the metadata owner. See the module docstring for threading."""

    @abstractmethod
    def memory_usage(self) -> tuple[int, int]:
        """(capacity, used) bytes of the memory the engine watches; used includes replicas
        still being written, capacity is 0 when nothing is mounted.

        Cheap: called on every PutEnd to decide whether kswapd should wake.
        """

    @abstractmethod
    def inspect(self, rec: EvictInfo[K], now: float) -> Verdict:
        """The eligibility of one candidate at `now` (the engine's clock). Must not mutate."""

    @abstractmethod
    def drop(self, rec: EvictInfo[K]) -> int:
        """Free this replica now; returns the bytes freed (0 if it no longer matched).

        Called only right after `inspect` said PRIMARY, DROPPABLE or SOFT_PINNED (cache mode)
        in the same pass with no await in between. When it was the object's last replica, the
        object is erased, as Mooncake does.
        """

    @abstractmethod
    def swap_out(self, rec: EvictInfo[K]) -> bool:
        """Pool mode: start moving this replica out of its memory (to another node's memory
        through the transfer engine, or to a lower tier); False when nothing can take it.

        Must not block: the move runs as a task and reports with
        `ReclaimEngine.on_swap_out_done(rec, moved)` after it switched the metadata to the new
        location and freed the source (moved=True), or after it failed with nothing changed
        (moved=False). The destination allocation must not itself trigger direct reclaim.
        """
