"""kvpool.protocol: what travels on a control-plane connection. No I/O happens here.

Modules: `framing` (frames, the streaming decoder, `ErrorReply`), `handshake` (`Hello`,
`Welcome`, the version and cluster checks), `messages` (the master's requests and replies),
`values` (the ids, enums and shared Structs those messages are made of).
This package may import `kvpool.errors` and `kvpool.config` only; `kvpool.rpc` moves the bytes.

Lifecycle of a connection
-------------------------

1. **Handshake.** The client connects and sends ``Hello(protocol_version, cluster_id,
   client_name, auth)`` as request id 0. The server answers ``Welcome(protocol_version,
   cluster_id, server_name)`` on id 0, or an ``ErrorReply`` (INVALID_VERSION, ILLEGAL_CLIENT
   for another cluster, INVALID_PARAMS when the first frame is not a Hello) and closes.
2. **Frames.** Every message after that is one frame: ``u32 length | u64 request id | msgpack
   payload`` (little-endian; ``length`` counts the id and the payload). Payloads are msgspec
   Structs, tagged, one class per message, so decoding is validation: a payload that decodes
   is a well-formed request of a known kind.
3. **Pipelining.** A client may send many requests before reading any reply. Ids are the
   client's own (unique among its requests in flight, never 0); the server answers each with
   the same id, possibly out of order (a slow request does not hold back a fast one), and may
   coalesce several replies into one write.
4. **Error replies.** Protocol-level failures are answered with ``ErrorReply(code, message)``
   carrying an `ErrorCode` number, in a frame whose id has `framing.ERROR_FLAG` (bit 63) set:
   an undecodable payload (DESERIALIZE_FAIL), a payload that is valid msgpack but no known
   request (INVALID_PARAMS), a handler that raised (INTERNAL_ERROR, or the code of the kvpool
   exception it raised); the connection goes on serving. A length prefix over the receiver's
   ``max_frame_bytes`` (BUFFER_OVERFLOW) or below 8 (INVALID_PARAMS) is answered and then the
   connection is closed, since frame boundaries are lost. Service outcomes (OBJECT_NOT_FOUND
   and the like) are not errors of the protocol: they travel as ``code`` fields of replies.
5. **Close.** Either side may close at any time; requests in flight then fail at the client
   with RPC_FAIL, and a late reply to a request the client gave up on (RPC_TIMEOUT) is dropped
   by id, never handed to another call.
"""

from kvpool.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_FLAG,
    ErrorReply,
    FrameDecoder,
    FrameEncoder,
    FrameError,
    FrameTooLarge,
)
from kvpool.protocol.handshake import PROTOCOL_VERSION, Hello, Welcome

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "ERROR_FLAG",
    "PROTOCOL_VERSION",
    "ErrorReply",
    "FrameDecoder",
    "FrameEncoder",
    "FrameError",
    "FrameTooLarge",
    "Hello",
    "Welcome",
]
