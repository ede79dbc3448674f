"""The invalidation stream: the master tells the clients that read in cached mode which keys
changed, on the connection they already have (docs/parts/client.md, "Read modes").

Lifecycle: a Store in `read_mode="cached"` sends `Subscribe(tenant)` on its master connection
(answered by `Reply`). From then on, whenever an object of that tenant leaves the index
(removed, evicted, replaced by an upsert, or dropped with its segment) or is rewritten in place,
the master pushes an `Invalidate` naming its key, as a frame with request id
`PUSH_REQUEST_ID`, which no client ever uses for a request. Keys removed in one turn of the
master's loop travel in one frame. The master queues at most `MAX_PENDING_KEYS` keys per
connection between frames; past that, or while the connection is not read (its write buffer
full), it drops the keys and later sends one `Invalidate(everything=True)`: the client then
forgets every remembered place. A subscription lives as long as its connection: a client that
reconnects forgets everything and subscribes again.

Neither message is part of `messages.Request` / `messages.Response` (that module is at its size
limit): the master's RPC server decodes `Request | Subscribe`, and the client takes push frames
out before it decodes replies.
"""

from __future__ import annotations

from typing import Final

import msgspec

from kvpool.protocol.framing import MAX_REQUEST_ID
from kvpool.protocol.values import Message, TenantId

__all__ = ["MAX_PENDING_KEYS", "PUSH_REQUEST_ID", "Invalidate", "Subscribe", "decode_push"]

PUSH_REQUEST_ID: Final = MAX_REQUEST_ID
"""The request id of the frames the master pushes unasked (client ids count up from 1)."""
MAX_PENDING_KEYS: Final = 4096
"""Keys queued per subscribed connection between two frames; more become `everything`."""


class Subscribe(Message):
    """Push an `Invalidate` to this connection for every key of `tenant` that changes."""

    tenant: TenantId = TenantId("default")


class Invalidate(Message):
    """Pushed: these keys of `tenant` were removed or replaced; `everything`: forget every
    key (the master dropped some)."""

    tenant: TenantId
    keys: list[str] = []
    everything: bool = False


_DECODER = msgspec.msgpack.Decoder(Invalidate)


def decode_push(payload: bytes) -> Invalidate | None:
    """The `Invalidate` in a push frame's payload, None when it is not one."""
    try:
        return _DECODER.decode(payload)
    except msgspec.DecodeError:
        return None
