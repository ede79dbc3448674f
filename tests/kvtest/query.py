"""Ask a running master what it holds, as a test checks it: Stats, and where keys' replicas are."""

from __future__ import annotations

from kvpool.protocol.messages import (
    BatchGetReplicaList,
    BatchReplicaListReply,
    Response,
    Stats,
    StatsReply,
)
from kvpool.rpc.client import RpcClient

__all__ = ["replica_segments", "stats"]


def stats(address: str) -> StatsReply:
    """The master's Stats, over a connection of its own."""
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def replica_segments(address: str, keys: list[str]) -> list[set[str]]:
    """For each key, the names of the segments its replicas are on (empty for a missing key)."""
    with RpcClient(address, response_type=Response) as rpc:
        reply = rpc.call_as(BatchGetReplicaList(keys), BatchReplicaListReply)
    return [{d.segment for d in r.replicas} for r in reply.results]
