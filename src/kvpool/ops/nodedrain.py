"""A stopping node drains its own segments before it unmounts them (`kvpool node --drain-grace`).

`drain_node(runtime, grace)` asks the master to drain every segment of the node
(`DrainSegment`: nothing new is placed there, objects that must not be lost are moved out by
MOVE tasks that this node's own `TaskExecutor` runs, then the master unmounts it), and polls
`DrainStatus` until each has ended or `grace` (plus a second of slack) has passed. The caller
keeps its heartbeat and task executor running meanwhile, and unmounts as usual afterwards
(idempotent at the master). Failures are logged, never raised: a node that cannot drain still
stops.
"""

from __future__ import annotations

import logging
import time

from kvpool.client.node import NodeRuntime
from kvpool.errors import KVPoolError
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import SegmentName

__all__ = ["drain_node"]

log = logging.getLogger(__name__)

_POLL_S = 0.2


def drain_node(runtime: NodeRuntime, grace: float) -> dict[SegmentName, DrainReply]:
    """Drain every segment of `runtime` within about `grace` seconds; the last replies."""
    out: dict[SegmentName, DrainReply] = {}
    names = list(runtime.segments)
    try:
        for name in names:
            out[name] = runtime.rpc.call_as(DrainSegment(name, int(grace * 1000)), DrainReply)
        deadline = time.monotonic() + grace + 1.0
        pending = [n for n in names if out[n].code == 0 and out[n].state not in _ENDED]
        while pending and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            for name in list(pending):
                reply = runtime.rpc.call_as(DrainStatus(name), DrainReply)
                out[name] = reply
                if reply.code != 0 or reply.state in _ENDED:
                    pending.remove(name)
    except KVPoolError as exc:
        log.warning("drain before stopping failed: %s", exc)
    for name, r in out.items():
        log.info(
            "segment %s drained: %s, %d of %d objects to keep moved, %d failed",
            name,
            r.state or f"code {r.code}",
            r.moved,
            r.must_keep,
            r.failed,
        )
    return out


_ENDED = ("done", "aborted")
