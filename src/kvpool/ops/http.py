"""`HttpServer`: a small HTTP/1.1 server on the running asyncio loop, for metrics and admin.

It serves a handful of operators and one Prometheus: requests read one at a time per connection
(keep-alive honoured), a request head of at most 16 KiB, bodies of at most 64 KiB, a deadline
for reading the head and one for the body, at most `MAX_CONNECTIONS` connections at once. Routes map (method, path) to a handler that gets an `HttpRequest` and returns
`Response` (or an awaitable of one, for work done in steps that yield to the loop). A handler
raises `HttpError` for a bad request: the client gets that status and a JSON
`{"error": message}`; any other exception is logged and answered 500 (a bug, never expected).

Threading: everything runs on the loop that called `start()`, the same loop as the master's
RPC server, so handlers read the metadata without locks; each must be short or yield.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "MAX_CONNECTIONS",
    "Handler",
    "HttpError",
    "HttpRequest",
    "HttpServer",
    "Response",
    "json_response",
]

log = logging.getLogger(__name__)

_MAX_HEAD = 16 * 1024
_MAX_BODY = 64 * 1024
_HEAD_TIMEOUT = 10.0
_TLS_HANDSHAKE_S = 10.0
#: Connections served at once; more are answered 503 and closed (operators and a Prometheus
#: or two are the clients: this is a guard, not a capacity).
MAX_CONNECTIONS = 64
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpError(Exception):
    """A request the server refuses: `status` (4xx) and a message for the client."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: Extra response headers (`WWW-Authenticate` of a 401).
        self.headers = headers or {}


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes = b""
    #: Request headers, names in lower case.
    headers: dict[str, str] = field(default_factory=dict)

    def param(self, name: str, default: str | None = None) -> str | None:
        """The single value of query parameter `name` (400 when it is given twice)."""
        values = self.query.get(name)
        if not values:
            return default
        if len(values) > 1:
            raise HttpError(400, f"{name}: given {len(values)} times, expected once")
        return values[0]

    def required(self, name: str) -> str:
        value = self.param(name)
        if value is None or value == "":
            raise HttpError(400, f"{name}: missing (e.g. ?{name}=...)")
        return value

    def int_param(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.param(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise HttpError(400, f"{name}: {raw!r} is not an integer") from None
        if not lo <= value <= hi:
            raise HttpError(400, f"{name}: {value} is out of range [{lo}, {hi}]")
        return value


@dataclass(frozen=True, slots=True)
class Response:
    body: bytes
    content_type: str = "application/json"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def json_response(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value, separators=(",", ":")).encode(), status=status)


Handler = Callable[[HttpRequest], "Response | Awaitable[Response]"]


class HttpServer:
    """Routes served on HOST:PORT (port 0 picks a free one) until `close()` (idempotent)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self._host = host
        self._port = port
        self._tls = tls
        """Serve HTTPS with this context (the process's `--tls-*`; `kvpool.rpc.tls`)."""
        self._routes: dict[tuple[str, str], Handler] = {}
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._closed = False

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "not started"
        sock = self._server.sockets[0].getsockname()
        return str(sock[0]), int(sock[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            self._host,
            self._port,
            ssl=self._tls,
            ssl_handshake_timeout=_TLS_HANDSHAKE_S if self._tls is not None else None,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._conns) >= MAX_CONNECTIONS:
            with contextlib.suppress(Exception):
                busy = json_response({"error": "too many connections"}, 503)
                await asyncio.wait_for(_write(writer, busy, False), _HEAD_TIMEOUT)
            writer.close()
            return
        self._conns.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; answers whether the connection stays open for another."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT)
        except asyncio.LimitOverrunError:
            await _write(writer, json_response({"error": "request head too large"}, 413), False)
            return False
        except asyncio.IncompleteReadError:
            return False
        if len(head) > _MAX_HEAD:
            await _write(writer, json_response({"error": "request head too large"}, 413), False)
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _write(writer, json_response({"error": "bad request line"}, 400), False)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > _MAX_BODY:
            await _write(writer, json_response({"error": "bad Content-Length"}, 413), False)
            return False
        # The body under the same deadline as the head: a peer that announces one and sends
        # nothing must not hold a connection slot (they are few) past it.
        body = await asyncio.wait_for(reader.readexactly(length), _HEAD_TIMEOUT) if length else b""
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        url = urlsplit(target)
        query = parse_qs(url.query, keep_blank_values=True)
        request = HttpRequest(method, url.path, query, body, headers)
        response = await self._dispatch(request)
        await _write(writer, response, keep, head_only=method == "HEAD")
        return keep

    async def _dispatch(self, request: HttpRequest) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        handler = self._routes.get((method, request.path))
        try:
            if handler is None:
                if any(p == request.path for _, p in self._routes):
                    raise HttpError(405, f"{request.method} is not served on {request.path}")
                raise HttpError(404, f"no such path: {request.path}")
            reply = handler(request)
            if inspect.isawaitable(reply):
                reply = await reply
            return reply
        except HttpError as exc:
            refused = json_response({"error": exc.message}, exc.status)
            refused.headers.update(exc.headers)
            return refused
        except Exception:
            log.exception("HTTP handler failed on %s %s", request.method, request.path)
            return json_response({"error": "internal error"}, 500)


async def _write(
    writer: asyncio.StreamWriter, response: Response, keep: bool, head_only: bool = False
) -> None:
    reason = _REASONS.get(response.status, "")
    head = [
        f"HTTP/1.1 {response.status} {reason}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        f"Connection: {'keep-alive' if keep else 'close'}",
    ]
    head.extend(f"{k}: {v}" for k, v in response.headers.items())
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    if not head_only:
        writer.write(response.body)
    await writer.drain()
