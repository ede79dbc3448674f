"""`MetadataObserver`: what a component whose state is tied to objects, segments or clients
hears from the core (`kvpool.master.core`).

The task table, the arena table, the repair queue and the invalidation hub are observers; the
core calls them in the order they were added (`MetadataCore.observe`), on the loop, inside the
operation that caused the event, and they may call back into the core. An observer may also
define ``object_rewritten(obj)``, called before an UpsertStart rewrites the complete `obj`, and
``tier_changed(obj)``, called when `obj` lost a disk or DFS replica and keeps others or gained
a replica beside one (a promotion); `kvpool.master.invalidation` defines both, and the core
looks them up on each observer that has them.
"""

from __future__ import annotations

from typing import Protocol

from kvpool.master.metadata import ObjectMeta
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ClientId

__all__ = ["MetadataObserver"]


class MetadataObserver(Protocol):
    """A component with state tied to objects, segments or clients (called on the loop, inside
    the operation that caused the event; may call back into the core)."""

    def object_removed(self, obj: ObjectMeta) -> None:
        """`obj` left the index (for any reason)."""
        ...

    def segment_mounted(self, seg: Segment) -> None:
        """`seg` was just mounted (a new record, though its name may have been seen before)."""
        ...

    def segment_unmounted(self, seg: Segment) -> None:
        """`seg` was just unmounted: its allocator is gone, nothing is freed into it again."""
        ...

    def client_expired(self, client_id: ClientId) -> None:
        """The client is dropped: its segments are unmounted and its PutStarts preempted
        already; it is forgotten right after the observers return."""
        ...

    def client_silenced(self, client_id: ClientId) -> None:
        """The client fell silent: its segments stopped serving (kept, not unmounted) and its
        PutStarts are preempted already; it is kept for `client_dead_ttl`."""
        ...

    def segment_restored(self, seg: Segment) -> None:
        """The silent `seg` serves again, with everything it held (its owner came back)."""
        ...

    def replicas_lost(self, obj: ObjectMeta) -> None:
        """`obj` lost replicas to unmounted segments and still has at least one."""
        ...
