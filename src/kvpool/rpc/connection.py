"""`Connection`: one accepted connection of an `RpcServer` (`kvpool.rpc.server`), the asyncio
Protocol that turns its frames into handler calls and its replies into writes.

What a connection does, in the order bytes meet it:

* before the handshake it parses one frame at a time, of at most 64 KiB, answers the `Hello`
  (`kvpool.protocol.handshake`) and, on a server with credentials, the challenge's `Proof`
  (UNAUTHENTICATED and close on a wrong one); the proven `Principal` is ``principal``;
* then it decodes each request with the server's one decoder (decoding is validation) and calls
  the handler inline; a reply returned directly is written at once (the lock-step hot path:
  one frame in, one write out), an awaitable runs as a task;
* it coalesces replies: all replies produced while handling one chunk of input, and all task
  replies finishing in the same loop iteration, leave in a single ``transport.write``;
* it applies back-pressure: while the transport's write buffer is above its high-water mark, or
  while ``max_inflight`` handler tasks run, it is neither served nor read further;
* a broken frame boundary or a failed handshake closes it after its error reply; a half-closed
  peer still gets the replies it is owed.

The server admits, counts, sweeps (handshake and idle timeouts) and closes its connections;
every method here runs on the server's loop. A lost connection drops its buffers at once and
keeps no raised exception, so it leaves no cyclic garbage (`kvpool master` freezes its heap).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, NewType, cast

import msgspec

from kvpool.errors import ErrorCode
from kvpool.logs import RateLimitedLog
from kvpool.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_FLAG,
    HEADER,
    HEADER_SIZE,
    MIN_FRAME_LENGTH,
    Frame,
    FrameDecoder,
    FrameError,
)
from kvpool.protocol.handshake import HANDSHAKE_REQUEST_ID, Welcome, check_hello
from kvpool.rpc.auth import Principal

if TYPE_CHECKING:
    from kvpool.rpc.server import RpcServer

__all__ = ["Connection", "ConnectionId"]

log = logging.getLogger(__name__)
#: Repeated per-connection events (bad frames, refusals): a line per kind per 10 s.
limited_log = RateLimitedLog(log, 10.0)

ConnectionId = NewType("ConnectionId", int)

#: The largest frame a connection may send before its handshake: a Hello is a few KiB, so a
#: peer that has not shown it belongs to the cluster cannot make the server buffer 64 MiB.
_PRE_HANDSHAKE_FRAME_BYTES: Final = 64 << 10


class Connection(asyncio.Protocol):
    """One accepted connection. Handlers receive it as ``conn``.

    Public read-only attributes: ``conn_id``, ``peer`` ("host:port", or "unix" for a connection
    on the server's Unix socket), ``client_name`` (from the Hello), ``handshaken``,
    ``principal`` (the identity it proved; None on a server without credentials). ``close()``
    ends the connection from the service side (for example when a client is evicted).

    A handler's awaitable runs to completion even when its connection goes away (the reply is
    then dropped): a service never sees a request cancelled half-way because a client left.
    Only `RpcServer.close()` cancels what is still running.
    """

    def __init__(self, server: RpcServer, conn_id: ConnectionId, *, unix: bool = False) -> None:
        self._server = server
        self.conn_id = conn_id
        # An abstract-socket peer has no name of its own to show.
        self.peer = "unix" if unix else ""
        self.client_name = ""
        self.handshaken = False
        self.principal: Principal | None = None
        # The challenge sent and not yet answered (None: no Hello yet, or no credentials).
        self._nonce: bytes | None = None
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(min(server.max_frame_bytes, _PRE_HANDSHAKE_FRAME_BYTES))
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._closing = False
        self._close_requested = False
        self._eof = False
        # Handler tasks of this connection still running, bounded by max_inflight.
        self._inflight = 0
        self._paused_for_writes = False
        self._paused_for_inflight = False
        # Frames received but not yet served (only while max_inflight pauses serving).
        self._backlog: collections.deque[Frame] = collections.deque()
        # Idle tracking, cheap on the hot path: data_received sets `_seen`; the server's sweep
        # clears it and notes when it last found it set (loop time).
        self._seen = False
        self._opened = self._last_seen = server._now()
        # When this connection's last frames came (`kvpool.rpc.spin`; 0: none yet).
        self._arrived = 0.0
        # The remote IP this connection counts against (None: not counted, e.g. refused).
        self._peer_key: str | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement its methods.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        key = "unix"
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"
            key = str(peer[0])
        refusal = self._server._admit(self, key)
        if refusal is not None:
            # Refused before the handshake: the client reads this ErrorReply where it expects
            # its Welcome (request id 0) and reports the code and the reason.
            self._closing = True
            self._transport.write(
                self._server._encoder.encode_error(
                    HANDSHAKE_REQUEST_ID, ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, refusal
                )
            )
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._transport = None
        self._out.clear()
        self._backlog.clear()
        self._decoder = _SPENT_DECODER  # drop any partial frame now, not when we are collected
        self._server._connection_gone(self)

    def pause_writing(self) -> None:
        # The peer is not reading its replies: stop reading its requests until it catches up.
        self._paused_for_writes = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_for_writes = False
        self._update_reading()

    def _resume_serving(self) -> None:
        if self._closing:
            return
        self._drain()
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._closing:
            return
        if self._paused_for_writes or self._paused_for_inflight:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._seen = True
        busy = self._server.busy
        if busy is not None:
            self._arrived = busy.arrived(self._arrived)
        if self.handshaken and not self._backlog and not self._paused_for_inflight:
            # The hot path (every lock-step request): one whole frame, served and answered
            # here with one write, without the backlog's queue and loop (`_drain` does the
            # same for anything else: several frames, a partial one, a broken stream).
            decoder = self._decoder
            frames: list[Frame] | None = None
            if not decoder._buf and decoder.error is None and len(data) >= HEADER_SIZE:
                # The decoder's own one-frame fast path, inlined: no call, no list.
                length, request_id = HEADER.unpack_from(data)
                if length + 4 != len(data) or not (
                    MIN_FRAME_LENGTH <= length <= decoder.max_frame_bytes
                ):
                    request_id = -1
            else:
                request_id = -1
            if request_id < 0:
                try:
                    frames = decoder.feed(data)
                except FrameError:
                    frames = []
                if len(frames) == 1 and decoder.error is None:
                    request_id = frames[0][0]
            if request_id >= 0:
                payload = data[HEADER_SIZE:] if frames is None else frames[0][1]
                frame = self._serve(request_id, payload, self._server)
                if frame is not None:
                    out = self._out
                    transport = self._transport
                    if out or transport is None:
                        out.append(frame)  # behind replies not yet written (keeps order)
                        self._flush()
                    else:
                        transport.write(frame)
                return
            assert frames is not None
            self._backlog.extend(frames)
            self._drain()
            return
        try:
            # Before the handshake one frame at a time: what a peer pipelines behind its Hello
            # is parsed only once the Hello was answered, under the handshaken frame limit.
            frames = self._decoder.feed(data, 0 if self.handshaken else 1)
        except FrameError:
            frames = []
        self._backlog.extend(frames)
        self._drain()

    def _drain(self) -> None:
        """Serve the frames received so far, in order, unless too much work is in flight."""
        backlog = self._backlog
        server = self._server
        refused = False
        while backlog and not self._paused_for_inflight:
            request_id, payload = backlog.popleft()
            if not self.handshaken:
                if not self._handshake(request_id, payload):
                    refused = True
                    backlog.clear()
                    break
                # The next frame (all of them once handshaken) waited in the decoder; a bad one
                # is recorded in the decoder's error and answered below.
                with contextlib.suppress(FrameError):
                    backlog.extend(self._decoder.feed(b"", 0 if self.handshaken else 1))
                continue
            frame = self._serve(request_id, payload, server)
            if frame is not None:
                self._out.append(frame)
        exc = self._decoder.error
        if exc is not None and not backlog and not refused and not self._closing:
            # Framing is lost: answer the frames that came before the break (done above),
            # then the break itself, then close.
            limited_log.warning(
                "bad-frame", "closing connection %s from %s: %s", self.conn_id, self.peer, exc
            )
            self._out.append(
                server._encoder.encode_error(exc.request_id or 0, exc.code, exc.message)
            )
            self._closing = True
        self._flush()
        if (refused or self._closing) and self._transport is not None:
            # close() sends what is buffered first, so the error reply reaches the peer.
            self._transport.close()
        elif self._eof and not self._inflight and not backlog:
            self.close()  # a half-closed peer has been answered in full

    def eof_received(self) -> bool | None:
        # The peer has finished sending (a half-close). Replies still being computed are
        # owed to it: keep our side open until they are written, then close.
        self._eof = True
        if self._inflight or self._backlog:
            return True
        return None  # nothing owed: close now

    # -- requests ---------------------------------------------------------------------------

    def _handshake(self, request_id: int, payload: bytes) -> bool:
        """Answer the first frame; False when the connection was refused (and is closing)."""
        server = self._server
        if self._nonce is not None:
            return self._check_proof(request_id, payload)
        try:
            hello = server._hello_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            self._refuse(request_id, ErrorCode.INVALID_PARAMS, f"expected a Hello first: {exc}")
            return False
        if request_id != HANDSHAKE_REQUEST_ID:
            self._refuse(request_id, ErrorCode.INVALID_PARAMS, "a Hello must have request id 0")
            return False
        refusal = check_hello(
            hello, cluster_id=server.cluster_id, protocol_version=server.protocol_version
        )
        if refusal is not None:
            self._refuse(request_id, ErrorCode(refusal.code), refusal.message)
            return False
        self.client_name = hello.client_name
        if server.tokens is not None:
            self._nonce = server.tokens.challenge()
            self._welcome(challenge=self._nonce)
            return True
        self._admitted()
        return True

    def _check_proof(self, request_id: int, payload: bytes) -> bool:
        server = self._server
        tokens = server.tokens
        nonce, self._nonce = self._nonce, None
        assert nonce is not None and tokens is not None
        try:
            proof = server._proof_decoder.decode(payload)
        except msgspec.DecodeError:
            proof = None
        principal = (
            None
            if proof is None or request_id != HANDSHAKE_REQUEST_ID
            else tokens.verify(proof, nonce, server.cluster_id, self.client_name)
        )
        if principal is None:
            server.auth_failures += 1
            limited_log.warning(
                "auth-failed",
                "%s: connection %s from %s (%r) failed authentication",
                server.server_name,
                self.conn_id,
                self.peer,
                self.client_name,
            )
            # One reason for every failure: a prober learns nothing about which tokens exist.
            self._refuse(request_id, ErrorCode.UNAUTHENTICATED, "authentication failed")
            return False
        self.principal = principal
        assert proof is not None
        key = tokens.wrap_data_key(proof.key_id, nonce, server.cluster_id, self.client_name)
        self._admitted(principal, key)
        return True

    def _admitted(self, principal: Principal | None = None, data_key: bytes = b"") -> None:
        self.handshaken = True
        self._decoder.max_frame_bytes = self._server.max_frame_bytes
        if principal is None:
            self._welcome()
        else:
            self._welcome(tenant=principal.tenant, role=principal.role.value, data_key=data_key)

    def _welcome(
        self, *, challenge: bytes = b"", tenant: str = "", role: str = "", data_key: bytes = b""
    ) -> None:
        server = self._server
        self._out.append(
            server._encoder.encode(
                HANDSHAKE_REQUEST_ID,
                Welcome(
                    server.protocol_version,
                    server.cluster_id,
                    server.server_name,
                    server.unix_address,
                    0 if server.term is None else server.term(),
                    challenge,
                    tenant,
                    role,
                    data_key,
                ),
            )
        )

    def _refuse(self, request_id: int, code: ErrorCode, message: str) -> None:
        limited_log.info(
            "bad-handshake", "refusing connection %s from %s: %s", self.conn_id, self.peer, message
        )
        self._out.append(self._server._encoder.encode_error(request_id, code, message))
        self._closing = True

    def _serve(self, request_id: int, payload: bytes, server: RpcServer) -> bytes | None:
        """The reply frame to one request, or None when its handler answered an awaitable
        (a task then sends the frame when it finishes)."""
        if request_id & ERROR_FLAG or request_id == HANDSHAKE_REQUEST_ID:
            return server._encoder.encode_error(
                request_id, ErrorCode.INVALID_PARAMS, f"request id {request_id} is reserved"
            )
        try:
            request = server._request_decoder.decode(payload)
        except msgspec.ValidationError as exc:
            return server._encoder.encode_error(
                request_id, ErrorCode.INVALID_PARAMS, f"not a valid request: {exc}"
            )
        except msgspec.DecodeError as exc:
            return server._encoder.encode_error(
                request_id, ErrorCode.DESERIALIZE_FAIL, f"undecodable payload: {exc}"
            )
        try:
            reply = server._handler(request, self)
        except Exception as exc:
            return server._handler_error(request_id, request, exc)
        if isinstance(reply, msgspec.Struct) or not inspect.isawaitable(reply):
            # `FrameEncoder.encode`, inlined (one Python call fewer per request).
            try:
                body = server._encode_payload(reply)
            except Exception:  # not encodable: `_encode_reply` says why
                return server._encode_reply(request_id, reply)
            length = len(body) + MIN_FRAME_LENGTH
            if length > server.max_frame_bytes:
                return server._encode_reply(request_id, reply)  # too large: the same answer
            return HEADER.pack(length, request_id) + body
        task = asyncio.ensure_future(self._finish(request_id, request, reply))
        server._tasks.add(task)
        task.add_done_callback(server._tasks.discard)
        self._inflight += 1
        if self._inflight >= server.max_inflight and not self._paused_for_inflight:
            # A peer may not park unbounded work on the server: stop serving (and reading)
            # its requests until some of its running ones finish.
            self._paused_for_inflight = True
            self._update_reading()
        return None

    async def _finish(self, request_id: int, request: Any, pending: Awaitable[Any]) -> None:
        server = self._server
        try:
            reply = await pending
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            frame = server._handler_error(request_id, request, exc)
        else:
            frame = server._encode_reply(request_id, reply)
        finally:
            self._inflight -= 1
            if self._paused_for_inflight and self._inflight < self._server.max_inflight:
                self._paused_for_inflight = False
                # Serve the backlog (and read again) from the loop, not from this finally.
                asyncio.get_running_loop().call_soon(self._resume_serving)
        if self._closing:
            return
        self._out.append(frame)
        if self._eof and not self._inflight and not self._backlog:
            self.close()  # the last reply owed to a peer that half-closed: flush, then close
        if not self._flush_scheduled:
            # Replies of tasks that finish in the same loop iteration leave in one write.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out or self._transport is None:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._transport.write(data)

    # -- service side -----------------------------------------------------------------------

    def push(self, request_id: int, message: Any) -> bool:
        """Send `message` unasked, as a frame with `request_id` (a push the client expects,
        e.g. `kvpool.protocol.invalidation`); it leaves with the next write. False, and
        nothing queued, when the connection is closed or its peer is not reading (the write
        buffer is above its high-water mark)."""
        if self.closed or self._paused_for_writes or not self.handshaken:
            return False
        self._out.append(self._server._encode_reply(request_id, message))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    @property
    def closed(self) -> bool:
        return self._closing or self._close_requested or self._transport is None

    def close(self) -> None:
        """Close this connection once the replies queued so far have been written. Idempotent.

        Called from a handler, the close happens after the current batch of replies (the
        handler's own reply included) is flushed: the loop runs it as its next callback.
        """
        if self._closing or self._close_requested or self._transport is None:
            return
        self._close_requested = True
        asyncio.get_running_loop().call_soon(self._close_now)

    def _close_now(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection at once, discarding unsent replies. Idempotent."""
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    def _expire(self, code: ErrorCode, why: str) -> None:
        """Tell the peer why (an ErrorReply on id 0) and close: a timeout of the sweep."""
        if self._closing or self._transport is None:
            return
        self._closing = True
        self._out.clear()
        self._transport.write(self._server._encoder.encode_error(HANDSHAKE_REQUEST_ID, code, why))
        self._transport.close()


#: What a lost connection's decoder is replaced with: its buffers go at once.
_SPENT_DECODER: Final = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
