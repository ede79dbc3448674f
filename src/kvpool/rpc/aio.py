"""`AsyncRpcClient`: the control-plane client for code that runs on an asyncio loop.

The same contract as the sync `RpcClient` (`kvpool.rpc.client`), built on an asyncio Protocol:
``data_received`` resolves each call's future by request id, so any number of tasks pipeline on
one connection. A broken connection fails every call in flight with `RpcError` (RPC_FAIL) and the
next call reconnects (handshake included); a call past its timeout raises RPC_TIMEOUT and forgets
its id so the late reply is dropped; an `ErrorReply` raises the exception of its code. It moves
to the server's abstract Unix socket after the TCP handshake exactly as `RpcClient` does (same
``unix`` option, same ``KVPOOL_RPC_UNIX``, same checks and fallback to TCP); `transport` says
which one it uses.

One client belongs to one event loop (the one that connected it); it is not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
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
    Proof,
    Welcome,
    is_abstract_unix_address,
)
from kvpool.rpc.channel import Transport
from kvpool.rpc.connector import (
    answer_welcome,
    check_timeout,
    parse_address,
    unix_enabled,
    welcome_of,
)
from kvpool.rpc.server import union_members

__all__ = ["AsyncRpcClient"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_DEFAULT_WINDOW: Final = 128


class _Protocol(asyncio.Protocol):
    """One connection: routes reply frames to the futures waiting for them."""

    def __init__(
        self,
        client: AsyncRpcClient,
        loop: asyncio.AbstractEventLoop,
        transport_kind: Transport = "tcp",
    ) -> None:
        self._client = client
        self.kind: Transport = transport_kind
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

    def retire(self) -> None:
        """Close an idle, handshaken connection gracefully (it was replaced by another)."""
        if self.broken is None:
            self.broken = RpcError(f"connection to {self._client.address} replaced")
        if self.transport is not None:
            self.transport.close()
            self.transport = None


class AsyncRpcClient:
    """An asyncio client of one `RpcServer`; arguments as for `RpcClient`."""

    #: The Unix socket attempt may take at most this share of the connect budget, so that the
    #: TCP connection it falls back to still has time to serve the call.
    _UNIX_BUDGET_SHARE: Final = 0.5

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
        unix: bool = True,
        token: bytes | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        #: The token proven when the server challenges (None: none; a challenge then fails).
        self.token = token
        #: TLS for the TCP connection (`kvpool.rpc.tls`; None: plain TCP).
        self.tls = tls
        self._host, self._port = parse_address(address)
        self.timeout = float(check_timeout(timeout))
        #: Whether connecting may move to the server's Unix socket (``unix`` and the env).
        self.unix = unix_enabled(unix)
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

    @property
    def transport(self) -> Transport | None:
        """What the current connection runs over, "unix" or "tcp"; None when not connected."""
        proto = self._proto
        return proto.kind if proto is not None and proto.broken is None else None

    async def call(self, request: Any, timeout: float | None = None) -> Any:
        """Send `request` and return its reply; concurrent calls pipeline."""
        budget = self.timeout if timeout is None else check_timeout(timeout)
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
        budget = self.timeout if timeout is None else check_timeout(timeout)
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

    def retarget(self, address: str) -> bool:
        """Point the client at `address` (an HA leader moved there), keeping the object: calls
        in flight fail with `RpcError` (RPC_FAIL), the next call connects to `address`. Call it
        on the client's loop. Whether anything changed (False: the same address, or closed)."""
        host, port = parse_address(address)
        if self._closed or address == self.address:
            return False
        old, self.address = self.address, address
        self._host, self._port = host, port
        proto, self._proto = self._proto, None
        if proto is not None:
            proto.fail(RpcError(f"connection to {old} replaced: the leader is at {address}"))
        return True

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
                    proto = await self._open(
                        loop_deadline=asyncio.get_running_loop().time() + budget
                    )
            except TimeoutError as exc:
                raise RpcError(
                    f"connecting to {self.address} timed out", ErrorCode.RPC_TIMEOUT
                ) from exc
            if self.closed:  # close() ran while we were connecting: nobody owns this one
                proto.fail(RpcError(f"client of {self.address} closed"))
                raise StoreClosed(f"client of {self.address} is closed")
            self._proto = proto
            return proto

    async def _open(self, loop_deadline: float) -> _Protocol:
        """Dial TCP and handshake; move to the server's Unix socket when it names one."""
        loop = asyncio.get_running_loop()
        try:
            _, proto = await loop.create_connection(
                lambda: _Protocol(self, loop),
                self._host,
                self._port,
                ssl=self.tls,
                server_hostname=self._host if self.tls is not None else None,
            )
        except OSError as exc:
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        welcome = await self._handshake(proto, self.address)
        self.server_name = welcome.server_name
        if self.unix and welcome.unix_address:
            budget = (loop_deadline - loop.time()) * self._UNIX_BUDGET_SHARE
            try:
                unix = await self._open_unix(welcome.unix_address, budget)
            except BaseException:  # cancelled (the caller's timeout, a task cancel)
                proto.fail(RpcError(f"connecting to {self.address} was cancelled"))
                raise
            if unix is not None:
                proto.retire()  # no request went over it: the server just sees it close
                return unix
        return proto

    async def _open_unix(self, name: str, budget: float) -> _Protocol | None:
        """A handshaken connection to the server's Unix socket `name`, or None (keep TCP)."""
        if not is_abstract_unix_address(name):
            log.warning(
                "%s advertises %r, not an abstract Unix socket: using TCP", self.address, name
            )
            return None
        if budget <= 0:
            return None
        loop = asyncio.get_running_loop()
        where = f"{self.address} (unix {name[1:]!r})"
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:  # EMFILE and the like: the TCP connection still serves
            log.warning("no Unix socket for %s (%s): using TCP", where, exc)
            return None
        sock.setblocking(False)
        proto: _Protocol | None = None
        ok = False
        try:
            async with asyncio.timeout(budget):
                # Connected here, then handed over: neither loop then reads the name as a path.
                await loop.sock_connect(sock, name)
                _, proto = await loop.create_unix_connection(
                    lambda: _Protocol(self, loop, "unix"), sock=sock
                )
                await self._handshake(proto, where, unix_address=name)
                ok = True
        except TimeoutError:
            log.warning("%s did not answer in %.3f s: using TCP", where, budget)
        except OSError as exc:
            # ECONNREFUSED: another host or network namespace (the expected case), or a server
            # that closed its listener; either way TCP serves.
            log.debug("%s unreachable (%s): using TCP", where, exc)
        except KVPoolError as exc:
            log.warning("handshake with %s failed (%s): using TCP", where, exc)
        finally:
            if not ok:  # failed or cancelled: leave nothing open
                if proto is not None:
                    proto.fail(RpcError(f"{where} not used"))  # its transport owns `sock`
                else:
                    sock.close()
        return proto if ok else None

    async def _exchange(self, proto: _Protocol, where: str, message: Hello | Proof) -> Welcome:
        """Send one handshake frame and await the `Welcome` answering it."""
        if proto.broken is not None or proto.transport is None:
            raise RpcError(f"handshake with {where} failed: connection lost")
        payload = self._encode(message)
        if proto.welcome.done():  # the answer to the Hello was read: await the next frame
            proto.welcome = asyncio.get_running_loop().create_future()
        proto.transport.write(
            HEADER.pack(len(payload) + MIN_FRAME_LENGTH, HANDSHAKE_REQUEST_ID) + payload
        )
        rid, payload = await proto.welcome
        return welcome_of(rid, payload, where)

    async def _handshake(self, proto: _Protocol, where: str, *, unix_address: str = "") -> Welcome:
        """Send the Hello and check the Welcome (for the Unix socket `unix_address` when
        given); the connection is dropped on any failure, which raises as a connect does."""
        try:
            assert proto.transport is not None
            welcome = await self._exchange(proto, where, self._hello)
            for _ in range(2):
                proof = answer_welcome(welcome, self._hello, self.token, unix_address, where)
                if proof is None:
                    break
                welcome = await self._exchange(proto, where, proof)
            else:
                raise RpcError(f"{where} challenged the proof of its own challenge")
        except msgspec.DecodeError as exc:
            proto.fail(RpcError(f"handshake with {where} failed: {exc}"))
            raise RpcError(f"handshake with {where} failed: {exc}") from exc
        except BaseException:
            proto.fail(RpcError(f"handshake with {where} failed"))
            raise
        return welcome


def _expire(fut: asyncio.Future[Any], address: str) -> None:
    if not fut.done():
        fut.set_exception(RpcError(f"no reply from {address} in time", ErrorCode.RPC_TIMEOUT))
