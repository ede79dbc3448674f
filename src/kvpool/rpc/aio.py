"""`AsyncRpcClient`: the control-plane client for code that runs on an asyncio loop.

The same contract as the sync `RpcClient` (`kvpool.rpc.client`), built on an asyncio Protocol:
``data_received`` resolves each call's future by request id, so any number of tasks pipeline on
one connection. A broken connection fails every call in flight with `RpcError` (RPC_FAIL) and the
next call reconnects (handshake included); a call past its timeout raises RPC_TIMEOUT and forgets
its id so the late reply is dropped; an `ErrorReply` raises the exception of its code.

One client belongs to one event loop (the one that connected it); it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any, Final, TypeVar, Union, cast

import msgspec

from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    RpcError,
    StoreClosed,
    error_for_code,
)
from kvpool.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    ERROR_FLAG,
    HEADER,
    MAX_REQUEST_ID,
    MIN_FRAME_LENGTH,
    ErrorReply,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
)
from kvpool.protocol.handshake import (
    HANDSHAKE_REQUEST_ID,
    PROTOCOL_VERSION,
    Hello,
    Welcome,
    check_welcome,
)
from kvpool.rpc.client import _check_timeout, parse_address
from kvpool.rpc.server import union_members

__all__ = ["AsyncRpcClient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DEFAULT_WINDOW: Final = 128


class _Protocol(asyncio.Protocol):
    """One connection: routes reply frames to the futures waiting for them."""

    def __init__(self, client: AsyncRpcClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self.decoder = FrameDecoder(client.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.welcome: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self.broken: KVPoolError | None = None
        # Frames queued in this loop iteration, written together by flush().
        self.out: list[bytes] = []
        self.flush_scheduled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they implement its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameError:
            frames = []
        client = self._client
        pending = self.pending
        for rid, payload in frames:
            if not self.welcome.done():
                self.welcome.set_result((rid, payload))
                continue
            fut = pending.pop(rid & MAX_REQUEST_ID, None)
            if fut is None or fut.done():
                continue  # late reply to a call that timed out or was cancelled: dropped
            try:
                if rid & ERROR_FLAG:
                    reply = client._decode_error(payload)
                    fut.set_exception(error_for_code(reply.code, reply.message))
                else:
                    fut.set_result(client._decode(payload))
            except msgspec.DecodeError as exc:
                fut.set_exception(
                    KVPoolError(
                        f"reply from {client.address} does not decode: {exc}",
                        ErrorCode.DESERIALIZE_FAIL,
                    )
                )
        if self.decoder.error is not None:
            self.fail(RpcError(f"bad frame from {client.address}: {self.decoder.error}"))

    def flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if self.transport is not None:
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RpcError(f"connection to {self._client.address} lost: {exc or 'closed'}"))

    def fail(self, exc: KVPoolError) -> None:
        """Fail every call in flight and drop the connection. Idempotent."""
        if self.broken is None:
            self.broken = exc
        if self._client._proto is self:
            self._client._proto = None
        if not self.welcome.done():
            self.welcome.set_exception(type(exc)(exc.message, exc.code))
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(type(exc)(exc.message, exc.code))
        if self.transport is not None:
            self.transport.abort()
            self.transport = None


class AsyncRpcClient:
    """An asyncio client of one `RpcServer`; arguments as for `RpcClient`."""

    def __init__(
        self,
        address: str,
        *,
        response_type: Any,
        cluster_id: str = "kvpool",
        client_name: str = "",
        timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        auth: bytes = b"",
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        self.address = address
        self._host, self._port = parse_address(address)
        self.timeout = float(_check_timeout(timeout))
        self.cluster_id = cluster_id
        self.client_name = client_name
        self.protocol_version = protocol_version
        self.max_frame_bytes = max_frame_bytes
        self._hello = Hello(protocol_version, cluster_id, client_name, auth)
        members = union_members(response_type)
        try:
            self._decode = msgspec.msgpack.Decoder(
                Union[members]  # noqa: UP007 - members is a runtime tuple
            ).decode
        except TypeError as exc:
            raise InvalidParams(
                f"response_type: msgspec cannot decode {response_type!r}: {exc}"
            ) from exc
        self._decode_error = msgspec.msgpack.Decoder(ErrorReply).decode
        self._encode = msgspec.msgpack.Encoder().encode
        self._ids = itertools.count(1)
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._closed = False
        self.server_name = ""

    # -- public API -------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect and handshake now (otherwise the first call does). Raises like a call."""
        await self._connection(self.timeout)

    @property
    def connected(self) -> bool:
        return self._proto is not None and self._proto.broken is None

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    async def call(self, request: Any, timeout: float | None = None) -> Any:
        """Send `request` and return its reply; concurrent calls pipeline."""
        budget = self.timeout if timeout is None else _check_timeout(timeout)
        payload = self._payload(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        proto = self._proto or await self._connection(budget)
        [(rid, fut)] = self._send(proto, [payload], loop)
        return await self._await(proto, rid, fut, deadline, loop)

    async def call_as(self, request: Any, reply_type: type[T], timeout: float | None = None) -> T:
        """`call`, checking that the reply is a `reply_type`."""
        reply = await self.call(request, timeout)
        if not isinstance(reply, reply_type):
            raise KVPoolError(
                f"{type(request).__name__} answered with {type(reply).__name__}, "
                f"expected {reply_type.__name__}",
                ErrorCode.DESERIALIZE_FAIL,
            )
        return reply

    async def call_many(
        self,
        requests: Sequence[Any],
        timeout: float | None = None,
        *,
        window: int = _DEFAULT_WINDOW,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Replies to `requests` in order, up to `window` in flight; semantics of
        `RpcClient.call_many`."""
        if not isinstance(window, int) or window < 1:
            raise InvalidParams(f"window: {window!r} must be at least 1")
        budget = self.timeout if timeout is None else _check_timeout(timeout)
        payloads = [self._payload(r) for r in requests]
        if not payloads:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        proto = self._proto or await self._connection(budget)
        results: list[Any] = []
        first_error: BaseException | None = None
        futures: list[tuple[int, asyncio.Future[Any]]] = []
        sent = 0
        refill_at = window // 2  # refill by half windows, as the sync client does
        while len(results) < len(payloads):
            if sent < len(payloads) and len(futures) - len(results) <= refill_at:
                take = payloads[sent : sent + window - (len(futures) - len(results))]
                futures.extend(self._send(proto, take, loop))
                sent += len(take)
                continue
            rid, fut = futures[len(results)]
            try:
                results.append(await self._await(proto, rid, fut, deadline, loop))
            except KVPoolError as exc:
                results.append(exc)
                first_error = first_error or exc
        if first_error is not None and not return_exceptions:
            raise first_error
        return results

    async def close(self) -> None:
        """Close the connection; calls in flight fail with RpcError, later calls raise
        `StoreClosed`. Idempotent."""
        self._closed = True
        proto = self._proto
        if proto is not None:
            proto.fail(RpcError(f"client of {self.address} closed"))
        self._proto = None

    async def __aenter__(self) -> AsyncRpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals --------------------------------------------------------------------------

    def _payload(self, request: Any) -> bytes:
        if self._closed:
            raise StoreClosed(f"client of {self.address} is closed")
        try:
            payload = self._encode(request)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidParams(f"cannot encode {type(request).__name__}: {exc}") from exc
        if len(payload) + MIN_FRAME_LENGTH > self.max_frame_bytes:
            raise FrameTooLarge(len(payload) + MIN_FRAME_LENGTH, self.max_frame_bytes)
        return payload

    def _send(
        self, proto: _Protocol, payloads: list[bytes], loop: asyncio.AbstractEventLoop
    ) -> list[tuple[int, asyncio.Future[Any]]]:
        if proto.broken is not None or proto.transport is None:
            exc = proto.broken or RpcError(f"connection to {self.address} is closed")
            raise type(exc)(exc.message, exc.code)
        futures = []
        frames = []
        for payload in payloads:
            rid = next(self._ids)
            fut: asyncio.Future[Any] = loop.create_future()
            proto.pending[rid] = fut
            futures.append((rid, fut))
            frames.append(HEADER.pack(len(payload) + MIN_FRAME_LENGTH, rid) + payload)
        proto.out.extend(frames)
        if not proto.flush_scheduled:
            # Frames of every call made in this loop iteration (many tasks calling at once)
            # leave in one write: one syscall and one wake-up of the server instead of one
            # per call. A lone call waits for just this callback before its bytes go.
            proto.flush_scheduled = True
            loop.call_soon(proto.flush)
        return futures

    async def _await(
        self,
        proto: _Protocol,
        rid: int,
        fut: asyncio.Future[Any],
        deadline: float,
        loop: asyncio.AbstractEventLoop,
    ) -> Any:
        if fut.done():
            return fut.result()
        delay = deadline - loop.time()
        timer = loop.call_later(max(delay, 0.0), _expire, fut, self.address)
        try:
            return await fut
        finally:
            timer.cancel()
            if not fut.done():  # the awaiting task was cancelled
                fut.cancel()
            if fut.cancelled() or fut.exception() is not None:
                # Forget the id, so that a late reply is dropped (ids are never reused).
                proto.pending.pop(rid, None)

    async def _connection(self, budget: float) -> _Protocol:
        if self._closed:
            raise StoreClosed(f"client of {self.address} is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._closed:
                raise StoreClosed(f"client of {self.address} is closed")
            if self._proto is not None and self._proto.broken is None:
                return self._proto
            try:
                async with asyncio.timeout(budget):
                    proto = await self._open()
            except TimeoutError as exc:
                raise RpcError(
                    f"connecting to {self.address} timed out", ErrorCode.RPC_TIMEOUT
                ) from exc
            if self.closed:  # close() ran while we were connecting: nobody owns this one
                proto.fail(RpcError(f"client of {self.address} closed"))
                raise StoreClosed(f"client of {self.address} is closed")
            self._proto = proto
            return proto

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            _, proto = await loop.create_connection(
                lambda: _Protocol(self, loop), self._host, self._port
            )
        except OSError as exc:
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        try:
            assert proto.transport is not None
            payload = self._encode(self._hello)
            proto.transport.write(
                HEADER.pack(len(payload) + MIN_FRAME_LENGTH, HANDSHAKE_REQUEST_ID) + payload
            )
            rid, payload = await proto.welcome
            if rid & ERROR_FLAG:
                refusal = self._decode_error(payload)
                raise error_for_code(refusal.code, f"{self.address} refused: {refusal.message}")
            welcome = msgspec.msgpack.decode(payload, type=Welcome)
            problem = check_welcome(
                welcome, cluster_id=self.cluster_id, protocol_version=self.protocol_version
            )
            if problem is not None:
                raise problem
        except msgspec.DecodeError as exc:
            proto.fail(RpcError(f"handshake with {self.address} failed: {exc}"))
            raise RpcError(f"handshake with {self.address} failed: {exc}") from exc
        except BaseException:
            proto.fail(RpcError(f"handshake with {self.address} failed"))
            raise
        self.server_name = welcome.server_name
        return proto


def _expire(fut: asyncio.Future[Any], address: str) -> None:
    if not fut.done():
        fut.set_exception(RpcError(f"no reply from {address} in time", ErrorCode.RPC_TIMEOUT))
