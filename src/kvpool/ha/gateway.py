"""`EtcdGateway`: a `Coordinator` over etcd's v3 JSON gateway, on the standard library only.

etcd serves its v3 API as JSON on the client port as well as gRPC (`POST /v3/kv/range`,
`/v3/kv/put`, `/v3/kv/deleterange`, `/v3/kv/txn`, `/v3/lease/grant`, `/v3/lease/keepalive`,
`/v3/lease/revoke`, `/v3/watch`; keys and values base64, 64-bit integers as decimal strings,
fields equal to their zero value left out). Why this and not a gRPC client (`aetcd`): the same
round-trip latency, no 20 MB of grpcio and protobuf, a blocking API that the Store's threads and
the master's election thread call alike, and plain sockets that a forked child simply reopens
(docs/parts/ha.md has the measurements).

Connections: an idle keep-alive connection per endpoint is reused (a small pool under a lock, so
threads never share one at the same time); any failure closes the connection it happened on. The
endpoint that answered last is tried first; the others in turn while the timeout lasts. A reused
connection that the server had already closed is retried once on a fresh one. Each watch has a
connection and a reader thread of its own.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvpool.ha.coordinator import (
    Coordinator,
    CoordinatorError,
    CoordinatorUnavailable,
    Delete,
    EventType,
    KeyValue,
    Lease,
    LeaseId,
    ModRevisionIs,
    Put,
    TxnResult,
    Watch,
    WatchEvent,
    WatchLost,
    prefix_end,
)
from kvpool.override import override

__all__ = ["EtcdGateway"]

log = logging.getLogger(__name__)

_IDLE_PER_ENDPOINT = 8
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key", "")),
        value=_unb64(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=LeaseId(int(raw.get("lease", 0))),
    )


def _revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def _split(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class EtcdGateway(Coordinator):
    """etcd at `endpoints` ("HOST:PORT" each, one cluster); `timeout`: the default per call (s)."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("EtcdGateway needs at least one endpoint")
        self.endpoints = [_split(e) for e in endpoints]
        self.timeout = timeout
        self._lock = threading.Lock()
        self._idle: dict[int, list[http.client.HTTPConnection]] = {
            i: [] for i in range(len(self.endpoints))
        }
        self._preferred = 0
        self._closed = False

    def _take(self, index: int, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._closed:
                raise CoordinatorUnavailable("the etcd client is closed")
            idle = self._idle[index]
            if idle:
                conn = idle.pop()
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.timeout = timeout
                return conn, True
        host, port = self.endpoints[index]
        return http.client.HTTPConnection(host, port, timeout=timeout), False

    def _give(self, index: int, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle[index]) < _IDLE_PER_ENDPOINT:
                self._idle[index].append(conn)
                return
        conn.close()

    def _call(self, path: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """POST `body` to `path`; the decoded reply. Tries each endpoint while time is left."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        payload = json.dumps(body).encode()
        n = len(self.endpoints)
        start = self._preferred
        failures: list[str] = []
        for i in range(n):
            index = (start + i) % n
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                status, data = self._post(index, path, payload, left)
            except (OSError, http.client.HTTPException) as exc:
                host, port = self.endpoints[index]
                failures.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
                continue
            self._preferred = index
            try:
                reply: dict[str, Any] = json.loads(data) if data else {}
            except ValueError as exc:
                raise CoordinatorError(f"etcd {path}: undecodable reply {data[:200]!r}") from exc
            if status != 200:
                message = reply.get("message") or reply.get("error") or data[:200].decode("replace")
                raise CoordinatorError(f"etcd {path}: HTTP {status}: {message}")
            return reply
        raise CoordinatorUnavailable(
            f"etcd {path}: no endpoint answered within {limit:.3g} s ({'; '.join(failures)})"
        )

    def _post(self, index: int, path: str, payload: bytes, timeout: float) -> tuple[int, bytes]:
        for _ in range(2):
            conn, reused = self._take(index, timeout)
            try:
                conn.request(
                    "POST", path, body=payload, headers={"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                data = resp.read()
            except _STALE:
                conn.close()
                if reused:
                    continue  # the server had closed the idle connection: once more, fresh
                raise
            except BaseException:
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                self._give(index, conn)
            return resp.status, data
        raise ConnectionResetError("connection closed twice")  # unreachable in practice

    @override
    def get(self, key: bytes, *, timeout: float | None = None) -> tuple[KeyValue | None, int]:
        reply = self._call("/v3/kv/range", {"key": _b64(key)}, timeout)
        kvs = reply.get("kvs", [])
        return (_kv(kvs[0]) if kvs else None), _revision(reply)

    @override
    def get_prefix(
        self, prefix: bytes, *, timeout: float | None = None
    ) -> tuple[list[KeyValue], int]:
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        reply = self._call("/v3/kv/range", body, timeout)
        return [_kv(raw) for raw in reply.get("kvs", [])], _revision(reply)

    @override
    def put(
        self,
        key: bytes,
        value: bytes,
        *,
        lease: LeaseId | None = None,
        timeout: float | None = None,
    ) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return _revision(self._call("/v3/kv/put", body, timeout))

    @override
    def delete(self, key: bytes, *, timeout: float | None = None) -> bool:
        reply = self._call("/v3/kv/deleterange", {"key": _b64(key)}, timeout)
        return int(reply.get("deleted", 0)) > 0

    @override
    def txn(
        self,
        compares: Sequence[ModRevisionIs],
        writes: Sequence[Put | Delete],
        *,
        read_on_failure: Sequence[bytes] = (),
        timeout: float | None = None,
    ) -> TxnResult:
        success: list[dict[str, Any]] = []
        for w in writes:
            if isinstance(w, Put):
                put: dict[str, Any] = {"key": _b64(w.key), "value": _b64(w.value)}
                if w.lease:
                    put["lease"] = str(w.lease)
                success.append({"request_put": put})
            else:
                success.append({"request_delete_range": {"key": _b64(w.key)}})
        body = {
            "compare": [
                {
                    "key": _b64(c.key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(c.revision),
                }
                for c in compares
            ],
            "success": success,
            "failure": [{"request_range": {"key": _b64(k)}} for k in read_on_failure],
        }
        reply = self._call("/v3/kv/txn", body, timeout)
        succeeded = bool(reply.get("succeeded", False))
        current: dict[bytes, KeyValue] = {}
        if not succeeded:
            for response in reply.get("responses", []):
                for raw in response.get("response_range", {}).get("kvs", []):
                    kv = _kv(raw)
                    current[kv.key] = kv
        return TxnResult(succeeded, _revision(reply), current)

    @override
    def grant(self, ttl: int, *, timeout: float | None = None) -> Lease:
        reply = self._call("/v3/lease/grant", {"TTL": str(ttl)}, timeout)
        if reply.get("error"):
            raise CoordinatorError(f"etcd lease grant: {reply['error']}")
        return Lease(LeaseId(int(reply["ID"])), int(reply.get("TTL", 0)))

    @override
    def keepalive(self, lease: LeaseId, *, timeout: float | None = None) -> int:
        # The gateway turns the bidirectional stream into one request, one {"result": ...}.
        reply = self._call("/v3/lease/keepalive", {"ID": str(lease)}, timeout)
        if "result" not in reply:
            raise CoordinatorError(f"etcd lease keepalive: {reply.get('error', reply)}")
        return int(reply["result"].get("TTL", 0))

    @override
    def revoke(self, lease: LeaseId, *, timeout: float | None = None) -> bool:
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease)}, timeout)
        except CoordinatorUnavailable:
            raise
        except CoordinatorError as exc:
            if "lease not found" in exc.message:
                return False
            raise
        return True

    @override
    def watch(
        self,
        key: bytes,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        timeout: float | None = None,
    ) -> Watch:
        request: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            request["range_end"] = _b64(prefix_end(key))
        if start_revision:
            request["start_revision"] = str(start_revision)
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        failures: list[str] = []
        n = len(self.endpoints)
        for i in range(n):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            host, port = self.endpoints[(self._preferred + i) % n]
            try:
                return _GatewayWatch(host, port, {"create_request": request}, left)
            except (OSError, http.client.HTTPException, CoordinatorError) as exc:
                failures.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
        raise CoordinatorUnavailable(f"etcd watch: no endpoint accepted it ({'; '.join(failures)})")

    @override
    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            for idle in self._idle.values():
                idle.clear()
        for conn in conns:
            conn.close()


class _Lost:
    """The sentinel a watch's reader puts last into its queue."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _GatewayWatch(Watch):
    """One `/v3/watch` stream: newline-separated JSON results, read on a thread."""

    def __init__(self, host: str, port: int, body: dict[str, Any], timeout: float) -> None:
        self._conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self._queue: queue.Queue[list[WatchEvent] | _Lost] = queue.Queue()
        self._closed = False
        try:
            self._conn.request(
                "POST",
                "/v3/watch",
                body=json.dumps(body),
                headers={"Content-Type": "application/json"},
            )
            self._resp = self._conn.getresponse()
            if self._resp.status != 200:
                raise CoordinatorError(f"etcd watch: HTTP {self._resp.status}")
            first = self._read_line()
            if first is None:
                raise CoordinatorError("etcd watch: the stream ended before it was created")
            created = json.loads(first).get("result", {})
            if not created.get("created"):
                raise CoordinatorError(f"etcd watch: not created: {first[:200]!r}")
            sock = self._conn.sock
            if sock is not None:
                sock.settimeout(None)  # events come when they come; close() unblocks the read
        except BaseException:
            self._conn.close()
            raise
        self._thread = threading.Thread(target=self._run, name="etcd-watch", daemon=True)
        self._thread.start()

    _buffer = b""

    def _read_line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            chunk = self._resp.read1(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _run(self) -> None:
        reason = "the stream ended"
        try:
            while True:
                line = self._read_line()
                if line is None:
                    break
                if not line.strip():
                    continue
                message = json.loads(line)
                result = message.get("result")
                if result is None:
                    reason = f"etcd watch error: {message.get('error', message)}"
                    break
                if result.get("canceled") or result.get("compact_revision"):
                    reason = (
                        f"etcd cancelled the watch (compacted at {result.get('compact_revision')}"
                        f", {result.get('cancel_reason', '')})"
                    )
                    break
                events = [
                    WatchEvent(EventType(raw.get("type", "PUT")), _kv(raw.get("kv", {})))
                    for raw in result.get("events", [])
                ]
                if events:
                    self._queue.put(events)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if self._closed:
            reason = "closed"
        self._queue.put(_Lost(reason))

    @override
    def get(self, timeout: float) -> list[WatchEvent] | None:
        try:
            item = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if isinstance(item, _Lost):
            self._queue.put(item)  # every later get raises too
            raise WatchLost(item.reason)
        return item

    @override
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
        self._conn.close()
