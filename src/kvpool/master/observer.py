"""`MetadataObserver`: what a component with state tied to objects, segments or clients hears
from the `MetadataCore` (`kvpool.master.core`), which calls it on the master's loop, inside the
operation that caused the event."""

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


# Optional callbacks, looked up with getattr by the core (only the observers that care
# define them): `object_rewritten(obj)` (an UpsertStart of the complete `obj`) and
# `tier_changed(obj)` (`obj` lost a disk or DFS replica and keeps others, or a copy added a
# replica beside a disk or DFS one: a promotion).
