"""Messages among the masters of an HA group (and `HaStatus`, which any peer may ask).

Part of the master's request and reply unions (`kvpool.protocol.messages`); the lifecycle is
told in `kvpool.master.replication` (the leader's side) and `kvpool.master.standby` (the
standby's): a standby long-polls `FollowLog(term, position)` (asking P acknowledges the
stream before P), bootstraps with `FetchSnapshot` chunks when told `snapshot_needed`.
"""

from __future__ import annotations

from kvpool.protocol.values import Message

__all__ = [
    "Barrier",
    "FetchSnapshot",
    "FollowLog",
    "HaRequest",
    "HaResponse",
    "HaStatus",
    "HaStatusReply",
    "LogReply",
    "SnapshotReply",
]


class HaStatus(Message):
    """Ask a master its HA role (any master answers, leader or not)."""


class Barrier(Message):
    """Answered `Reply(OK)` once everything the master had applied when it got this is on
    its standbys in sync (an HA leader; at once elsewhere), and only while it still leads:
    a lookup followed by a Barrier that succeeded at the same master saw committed state.
    How a client settles a write whose outcome it does not know (kvpool.client.leader)."""


class HaStatusReply(Message):
    code: int
    role: str = "single"
    """"single" (no --ha), "leader", "standby", or "lost-lead" (its lease's deadline passed:
    it answers reads from its metadata until it learns of a newer leader)."""
    member_id: str = ""
    term: int = 0
    """The term this master serves (0: it serves no term now)."""
    leader: str = ""
    """The leader's advertised HOST:PORT as this master knows it ("" when unknown)."""
    leader_term: int = 0
    position: int = 0
    """Leader: the end of its replication stream; standby: how far its copy reaches."""
    standbys: list[str] = []
    """Leader: member ids of the standbys in sync (each write waits for all of them)."""
    copy_term: int = 0
    """Standby: the term of the leader its copy follows (0: no copy yet)."""
    objects: int = 0
    """Objects in this master's metadata (a standby: in its copy)."""


class FollowLog(Message):
    """A standby asks the leader of `term` for its operation log from `position` (bytes of the
    stream since the term began). Asking position P acknowledges everything before P. The
    leader answers at once when it has records past P, else after up to `wait_ms`."""

    member_id: str
    term: int
    position: int
    wait_ms: int = 500


class LogReply(Message):
    code: int
    term: int = 0
    position: int = 0
    """Where `data` starts in the stream (the position asked)."""
    data: bytes = b""
    """Whole framed records (`kvpool.master.oplog`)."""
    snapshot_needed: bool = False
    """The position is not in the leader's buffer (another term, too far behind, dropped):
    the standby starts again with `FetchSnapshot`."""


class FetchSnapshot(Message):
    """A standby pulls the leader's state in chunks: `offset` 0 starts a new snapshot (the
    leader notes the stream position it starts from), then each next chunk by its byte
    offset in the snapshot."""

    member_id: str
    term: int
    offset: int = 0


class SnapshotReply(Message):
    code: int
    term: int = 0
    start: int = 0
    """The stream position the standby follows from once the snapshot is applied."""
    offset: int = 0
    data: bytes = b""
    done: bool = False


#: The requests and replies of this module, as the master's unions take them.
HaRequest = HaStatus | Barrier | FollowLog | FetchSnapshot
HaResponse = HaStatusReply | LogReply | SnapshotReply
