"""Frames on a kvpool control-plane connection: encoding, a streaming decoder, `ErrorReply`.

A frame is ``u32 length | u64 request id | msgpack payload``, little-endian, where ``length``
counts what follows it (the 8-byte id and the payload), so a frame occupies ``4 + length`` bytes
and ``length >= 8``. The receiver refuses any ``length`` above its ``max_frame_bytes`` before it
buffers the body, so a hostile or broken peer cannot make it allocate more than that.

Request ids are chosen by the client, unique among its requests in flight on one connection; the
reply to a request carries the same id, which is what lets a connection pipeline and lets replies
leave the server out of order. Id 0 is the handshake (`kvpool.protocol.handshake`).

The top bit of the id (`ERROR_FLAG`) marks a reply whose payload is an `ErrorReply` rather than a
message of the service's response union. Why a flag instead of putting `ErrorReply` into that
union: msgspec refuses unions that mix ``array_like`` or ``tag_field`` settings, and the RPC layer
must stay correct whatever settings a service picks for its own messages. With the flag the
receiver picks the decoder before decoding, so neither union needs to know the other.

This module does no I/O: `FrameDecoder` is fed whatever chunks a socket produced and returns the
complete frames it now holds.
"""

from __future__ import annotations

import struct
from typing import Annotated, Any, Final, NewType

import msgspec

from kvpool.errors import ErrorCode, InvalidParams

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "ERROR_FLAG",
    "HEADER_SIZE",
    "MAX_REQUEST_ID",
    "MIN_FRAME_LENGTH",
    "ErrorReply",
    "Frame",
    "FrameDecoder",
    "FrameEncoder",
    "FrameError",
    "FrameTooLarge",
    "RequestId",
    "encode_frame",
]

RequestId = NewType("RequestId", int)

HEADER: Final = struct.Struct("<IQ")
_LENGTH: Final = struct.Struct("<I")
_ID: Final = struct.Struct("<Q")
#: Bytes of the length prefix plus the request id.
HEADER_SIZE: Final = HEADER.size
#: The smallest valid value of the length prefix: the request id alone (an empty payload).
MIN_FRAME_LENGTH: Final = _ID.size
#: Set in the request id of a reply whose payload is an `ErrorReply`.
ERROR_FLAG: Final = 1 << 63
#: Request ids live below the flag bit.
MAX_REQUEST_ID: Final = ERROR_FLAG - 1
#: The largest ``length`` a receiver accepts unless configured otherwise (the u32 allows 4 GiB).
DEFAULT_MAX_FRAME_BYTES: Final = 64 << 20
_U32_MAX: Final = (1 << 32) - 1

#: A received frame: (request id as sent, flag bit included; payload bytes).
Frame = tuple[int, bytes]


class ErrorReply(msgspec.Struct, tag=True, frozen=True):
    """A protocol-level failure: bad frame, unknown or undecodable request, handler crash.

    Service outcomes (OBJECT_NOT_FOUND, ...) are never sent this way: they are ``code`` fields
    of the service's normal replies. ``code`` is an `ErrorCode` number.
    """

    code: int
    message: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class FrameError(InvalidParams):
    """The byte stream is not a valid frame sequence; the connection cannot be trusted further.

    ``request_id`` is the id of the offending frame when its header could be read, else None.
    """

    def copy(self) -> FrameError:
        """A fresh instance with the same code, message and id, and no traceback: what a
        long-lived owner keeps instead of a raised exception (whose traceback holds the frames,
        and their locals, that raised it)."""
        return FrameError(self.message, self.code, self.request_id)

    def __init__(
        self,
        message: str,
        code: ErrorCode = ErrorCode.INVALID_PARAMS,
        request_id: int | None = None,
    ) -> None:
        super().__init__(message, code)
        self.request_id = request_id


class FrameTooLarge(FrameError):
    """A length prefix above the receiver's limit (BUFFER_OVERFLOW)."""

    def __init__(self, length: int, limit: int, request_id: int | None = None) -> None:
        super().__init__(
            f"frame of {length} bytes exceeds the limit of {limit} bytes",
            ErrorCode.BUFFER_OVERFLOW,
            request_id,
        )
        self.length = length
        self.limit = limit

    def copy(self) -> FrameTooLarge:
        return FrameTooLarge(self.length, self.limit, self.request_id)


def encode_frame(request_id: int, payload: bytes) -> bytes:
    """One frame around an already encoded payload (no size limit is checked here)."""
    return HEADER.pack(len(payload) + MIN_FRAME_LENGTH, request_id) + payload


class FrameEncoder:
    """Encodes messages into frames; one per connection or per client (thread-safe).

    ``max_frame_bytes`` bounds what this side sends: a message too large for the peer is refused
    here with `FrameTooLarge`, before any byte of it is written, so the connection stays usable.
    """

    __slots__ = ("_encode", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        _check_limit(max_frame_bytes)
        self.max_frame_bytes = max_frame_bytes
        # Bound method looked up once: this sits on every request's path.
        self._encode = msgspec.msgpack.Encoder().encode

    def encode(self, request_id: int, message: Any) -> bytes:
        """The frame for `message` (a msgspec Struct, or anything msgspec can encode)."""
        payload = self._encode(message)
        length = len(payload) + MIN_FRAME_LENGTH
        if length > self.max_frame_bytes:
            raise FrameTooLarge(length, self.max_frame_bytes, request_id)
        return HEADER.pack(length, request_id) + payload

    def encode_error(self, request_id: int, code: ErrorCode | int, message: str = "") -> bytes:
        """The frame of an `ErrorReply` answering `request_id` (the error flag is set here)."""
        reply = ErrorReply(int(code), message[:4096])
        payload = self._encode(reply)
        return (
            HEADER.pack(len(payload) + MIN_FRAME_LENGTH, (request_id & MAX_REQUEST_ID) | ERROR_FLAG)
            + payload
        )


class FrameDecoder:
    """Reassembles frames from a byte stream cut into arbitrary chunks.

    `feed` returns every frame completed by the chunk, in order, and keeps any partial tail for
    the next call. A length prefix below `MIN_FRAME_LENGTH` or above ``max_frame_bytes`` breaks
    the stream for good (its frame boundaries are lost): the break is recorded in `error`
    (`FrameError` / `FrameTooLarge`) and every later `feed` raises it. The frames that the same
    chunk completed *before* the break are still returned, since the peer sent them intact, so a
    reader answers those first and then checks `error`; `feed` raises at once only when no
    frame preceded the break. Not thread-safe: one owner (the connection's reader) feeds it.

    `error` never carries a traceback: a raised exception's traceback holds `feed`'s frame, whose
    locals are this decoder, the chunk and every frame decoded from it, so keeping the raised
    exception here would make a reference cycle that only the cyclic collector frees, and a
    server that runs ``gc.freeze()`` (the master's monitor) never would: each connection that
    ended on a bad frame would leak its last chunk. The decoder keeps an untraced copy and
    raises fresh copies.
    """

    __slots__ = ("_buf", "error", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        _check_limit(max_frame_bytes)
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        #: Why the stream broke, once it has; None while it is sound.
        self.error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview, max_frames: int = 0) -> list[Frame]:
        """Append `data` to the stream; return the frames it completed (at most `max_frames`
        when > 0: the rest stays buffered, unchecked, for a later call, perhaps under another
        `max_frame_bytes`; `feed(b"")` parses it)."""
        if self.error is not None:
            raise self.error.copy()
        buf = self._buf
        if not buf and type(data) is bytes and len(data) >= HEADER_SIZE:
            # Fast path (a lock-step reply): the chunk is exactly one whole frame.
            length, request_id = HEADER.unpack_from(data)
            if length + 4 == len(data) and MIN_FRAME_LENGTH <= length <= self.max_frame_bytes:
                return [(request_id, data[HEADER_SIZE:])]
        if buf:
            buf += data
            view: bytes | bytearray = buf
        elif isinstance(data, bytes):
            # Common case: a chunk that starts on a frame boundary is parsed in place, and only
            # a partial tail (if any) is copied into the buffer.
            view = data
        else:
            view = bytes(data)
        frames: list[Frame] = []
        pos = 0
        end_of_data = len(view)
        limit = self.max_frame_bytes
        try:
            while end_of_data - pos >= 4:
                if max_frames and len(frames) >= max_frames:
                    break
                (length,) = _LENGTH.unpack_from(view, pos)
                if length < MIN_FRAME_LENGTH:
                    raise FrameError(
                        f"frame length {length} is below the minimum of {MIN_FRAME_LENGTH}"
                    )
                if end_of_data - pos < HEADER_SIZE:
                    break
                (request_id,) = _ID.unpack_from(view, pos + 4)
                if length > limit:
                    raise FrameTooLarge(length, limit, request_id)
                end = pos + 4 + length
                if end > end_of_data:
                    break
                frames.append((request_id, bytes(view[pos + HEADER_SIZE : end])))
                pos = end
        except FrameError as exc:
            self.error = exc.copy()  # untraced: see the class docstring
            buf.clear()
            if not frames:
                raise
            return frames
        if view is buf:
            if pos:
                del buf[:pos]
        elif pos < end_of_data:
            buf += view[pos:]
        return frames


def _check_limit(max_frame_bytes: int) -> None:
    if not isinstance(max_frame_bytes, int) or not (
        MIN_FRAME_LENGTH <= max_frame_bytes <= _U32_MAX
    ):
        raise InvalidParams(
            f"max_frame_bytes: {max_frame_bytes!r} is outside [{MIN_FRAME_LENGTH}, {_U32_MAX}]"
        )
