"""`ServerLimits`: what a `TransferServer` lets its peers hold (docs/parts/limits.md).

One frozen value per server. A process that runs several (tests) passes its own; `kvpool node`
sets the process default (`set_default_limits`) from its flags before its runtime starts the
server, and every other process (a Store with a segment) gets the defaults below.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from kvpool.errors import InvalidParams

__all__ = ["ServerLimits", "default_limits", "set_default_limits"]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds of one transfer server; durations in seconds."""

    workers: int = 64
    """Threads that serve requests at once; idle connections cost none (they wait in one
    epoll), and connections ready beyond this wait for a free thread."""
    max_connections: int = 8192
    """Connections held at once, lowered to fit the file-descriptor limit; one more is
    answered with UNAVAILABLE_IN_CURRENT_STATUS and closed."""
    max_connections_per_peer: int = 1024
    """Connections held at once from one remote IP."""
    first_request_timeout: float = 5.0
    """A connection that has sent no byte this long after it was accepted is closed (a client
    sends its first request at once)."""
    idle_timeout: float = 120.0
    """A connection that has sent nothing for this long is closed (clients drop pooled
    connections idle for half of it before using them again)."""
    stall_timeout: float = 5.0
    """A request that moves no byte (in or out) for this long fails and its connection is
    closed: a frozen or vanished client costs a worker seconds, not forever."""
    min_rate: int = 256 << 10
    """Bytes/s below which a request's payload (in or out) fails, after `stall_timeout` of
    grace: a peer that moves a byte now and then (never stalled) cannot hold a worker."""

    def __post_init__(self) -> None:
        for name in ("workers", "max_connections", "max_connections_per_peer", "min_rate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidParams(f"{name} must be a positive integer, got {value!r}")
        for name in ("first_request_timeout", "idle_timeout", "stall_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or math.isnan(value) or not value > 0:
                raise InvalidParams(f"{name} must be > 0 seconds, got {value!r}")


_default = ServerLimits()
_lock = threading.Lock()


def default_limits() -> ServerLimits:
    """The limits a `TransferServer` built without any gets."""
    return _default


def set_default_limits(limits: ServerLimits) -> None:
    """Make `limits` the process default (`kvpool node` applies its flags this way)."""
    global _default
    if not isinstance(limits, ServerLimits):
        raise InvalidParams(f"limits must be a ServerLimits, got {limits!r}")
    with _lock:
        _default = limits
