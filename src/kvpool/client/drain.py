"""The client side of a graceful unmount: drain segments of this node before unmounting them.

`drain_node(runtime, grace, names)` asks the master to drain each segment (`DrainSegment`:
nothing new is placed there, objects that must not be lost are moved out by MOVE tasks that
this process's own `TaskExecutor` runs, then the master unmounts it) and polls `DrainStatus`
every 0.2 s until each has ended or `grace` (plus a second of slack) has passed; a poll that
fails is retried, and after 3 failures in a row the wait ends (seed 000: poll the status, retry
3 times, then unregister the memory). The caller keeps its heartbeat and task executor running
meanwhile, and unmounts as usual afterwards (idempotent at the master). Failures are logged,
never raised: a node that cannot drain still stops. Used by `kvpool node --drain-grace` and
`Store.drain_segment`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvpool.client.node import NodeRuntime
from kvpool.errors import KVPoolError
from kvpool.protocol.drain import DrainReply, DrainSegment, DrainStatus
from kvpool.protocol.messages import SegmentName

__all__ = ["drain_node"]

log = logging.getLogger(__name__)

_POLL_S = 0.2
_RETRIES = 3


def drain_node(
    runtime: NodeRuntime,
    grace: float,
    names: list[SegmentName] | None = None,
    on_started: Callable[[], None] | None = None,
) -> dict[SegmentName, DrainReply]:
    """Drain `names` (every segment of `runtime` by default) within about `grace` seconds;
    the last reply for each. `on_started()` runs once the master has taken every drain (it
    places nothing new there from then on), before the wait."""
    out: dict[SegmentName, DrainReply] = {}
    if names is None:
        names = list(runtime.segments)
    try:
        for name in names:
            out[name] = runtime.rpc.call_as(DrainSegment(name, int(grace * 1000)), DrainReply)
    except KVPoolError as exc:
        log.warning("drain of %s could not start: %s", names, exc)
        return out
    if on_started is not None:
        on_started()
    deadline = time.monotonic() + grace + 1.0
    pending = [n for n in out if out[n].code == 0 and out[n].state not in _ENDED]
    failures = 0
    while pending and time.monotonic() < deadline and failures < _RETRIES:
        time.sleep(_POLL_S)
        for name in list(pending):
            try:
                reply = runtime.rpc.call_as(DrainStatus(name), DrainReply)
            except KVPoolError as exc:
                failures += 1
                log.warning("drain status of %s (try %d of %d): %s", name, failures, _RETRIES, exc)
                break
            failures = 0
            out[name] = reply
            if reply.code != 0 or reply.state in _ENDED:
                pending.remove(name)
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
