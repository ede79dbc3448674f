"""The Store's calls to the master, through whichever connection its node holds now.

The heartbeat replaces the node's `RpcClient` when pings fail (`NodeRuntime.reconnect`: a new
client, then the old one closed). A thread that had already taken the old client for a call
would then get `StoreClosed` from it, on a Store nobody closed. `call` and `call_as` take the
client at the last moment, and when it refuses because it was closed *and* the node holds
another one since, the request (which a closed client never sends) goes on the new one. A
call that was in flight on the old connection fails with `RpcError` as any broken connection
does; `StoreClosed` is left only for a Store the user closed (its node's client is closed and
not replaced).
"""

from __future__ import annotations

from typing import Any, Final, Protocol, TypeVar

from kvpool.errors import StoreClosed
from kvpool.rpc.client import RpcClient

__all__ = ["HasRpc", "call", "call_as"]

T = TypeVar("T")

_REPLACEMENTS: Final = 4
"""Connections replaced in a row during one call before its StoreClosed is believed."""


class HasRpc(Protocol):
    """Whatever holds the current master connection (`NodeRuntime`)."""

    rpc: RpcClient


def call_as(owner: HasRpc, request: Any, reply_type: type[T], timeout: float | None = None) -> T:
    """`owner.rpc.call_as(...)`, on the connection that replaced a closed one if need be."""
    rpc = owner.rpc
    try:
        return rpc.call_as(request, reply_type, timeout)
    except StoreClosed:
        for _ in range(_REPLACEMENTS):
            successor = _replacement(owner, rpc)
            if successor is None:
                break
            rpc = successor
            try:
                return rpc.call_as(request, reply_type, timeout)
            except StoreClosed:
                continue
        raise


def call(owner: HasRpc, request: Any, timeout: float | None = None) -> Any:
    """`owner.rpc.call(...)`, on the connection that replaced a closed one if need be."""
    rpc = owner.rpc
    try:
        return rpc.call(request, timeout)
    except StoreClosed:
        for _ in range(_REPLACEMENTS):
            successor = _replacement(owner, rpc)
            if successor is None:
                break
            rpc = successor
            try:
                return rpc.call(request, timeout)
            except StoreClosed:
                continue
        raise


def _replacement(owner: HasRpc, closed: RpcClient) -> RpcClient | None:
    """The client that replaced `closed`, or None when `closed` was not closed by a
    replacement (the user closed the Store, or the master answered
    UNAVAILABLE_IN_CURRENT_STATUS): then the StoreClosed stands."""
    current = owner.rpc
    if current is closed or not closed.closed:
        return None
    return current
