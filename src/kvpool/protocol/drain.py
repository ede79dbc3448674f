"""Graceful drain of a segment: the operator's (or a stopping node's) requests and the reply.

Part of the master's request and reply unions (`kvpool.protocol.messages`); the lifecycle is
told in `kvpool.master.drain`.
"""

from __future__ import annotations

from kvpool.protocol.values import Message, SegmentName

__all__ = ["DrainReply", "DrainSegment", "DrainStatus"]


class DrainSegment(Message):
    """Gracefully unmount segment `name` (docs/parts/ops.md): no new replica goes there from
    now on, objects that must not be lost are moved out, leases are waited for up to
    `grace_ms`, then it is unmounted. Idempotent: asking again answers the drain under way.
    Answers a `DrainReply` (SEGMENT_NOT_FOUND when no such segment is mounted)."""

    name: SegmentName
    grace_ms: int = 30_000


class DrainStatus(Message):
    """The progress of the drain of segment `name` (OBJECT_NOT_FOUND: none is known)."""

    name: SegmentName


class DrainReply(Message):
    code: int
    state: str = ""
    """scanning, moving, waiting_leases, done, or aborted (the segment went away first)."""
    objects: int = 0
    """Objects with a replica on the segment when it was scanned."""
    must_keep: int = 0
    """Of those, objects that must not be lost (pinned, or a last replica in pool mode)."""
    moved: int = 0
    failed: int = 0
    """Moves that failed for good (no room elsewhere, or the grace ran out first)."""
    leased: int = 0
    """Objects on the segment whose read lease is still running."""
    elapsed_s: float = 0.0
    grace_s: float = 0.0
