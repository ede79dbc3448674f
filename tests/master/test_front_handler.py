"""The master's request handler behind auth (`MasterServer._front_handler`): without a durable
log or HA, one closure does the segment guard's check, serves Subscribe and dispatches, so a
request reaches its handler through one Python frame, not three (invalidation hub, guard,
`_handle`). The guard's refusals and the invalidation stream are tested against real masters in
tests/security and tests/speed; this checks the shape of the chain."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from kvpool.master.config import MasterConfig
from kvpool.master.server import MasterServer
from kvpool.protocol.messages import GetReplicaList, ReplicaListReply


def _frames_to_handler(handler: Any, request: Any) -> tuple[list[str], Any]:
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        reply = handler(request, None)
    finally:
        sys.setprofile(None)
    return calls, reply


def test_a_request_reaches_its_handler_through_one_frame() -> None:
    server = MasterServer(MasterConfig(host="127.0.0.1", port=0))
    calls, reply = _frames_to_handler(server.rpc._handler, GetReplicaList("no-such-key"))
    assert isinstance(reply, ReplicaListReply) and reply.code != 0
    first = calls.index("ReadPath.get_replica_list")
    assert calls[:first] == ["MasterServer._front_handler.<locals>.handle"]
