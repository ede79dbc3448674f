"""The smallest faithful part of Mooncake's `mooncake.engine.TransferEngine`, for the shim.

SGLang imports `mooncake.engine.TransferEngine` for its remote-instance weight loader and its
disaggregation engine (sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py,
sglang/srt/model_executor/model_runner_components/remote_instance_weight_transporter.py) and
calls `initialize(hostname, "P2PHANDSHAKE", protocol, device)`, `get_rpc_port()`,
`register_memory` / `unregister_memory` (and their batch forms), `transfer_sync_write` /
`transfer_sync_read` (and their batch forms) and `send_probe`. This module offers those calls
with Mooncake's answers (0, or -1 on any failure), moving bytes over TCP:

* `initialize` starts a listener on the host of `hostname` (its port, or a free one when it has
  none): that port is `get_rpc_port()`, and the peer's session id is "host:port".
* A peer's write or read names an absolute address that must lie inside memory the serving
  engine registered (`register_memory`); anything else is refused, and the connection closed.
  The local buffer of a transfer is the caller's memory, as with Mooncake's TCP transport.

Frames, little-endian: request `op:u8 ('W' write, 'R' read, 'P' probe) addr:u64 length:u64`,
then `length` bytes for a write; answer `status:i32`, then `length` bytes for a read that
succeeded. Every socket has a timeout (`IO_TIMEOUT_S`), at most `MAX_CONNECTIONS` peers are
served at once, and one request moves at most the registered region it falls in.

Not offered: RDMA and GPU memory (this is host memory over TCP), notifies, async batches,
managed buffers, `get_engine()` (no C++ engine to hand out; it raises NotImplementedError).
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Final

__all__ = ["IO_TIMEOUT_S", "MAX_CONNECTIONS", "TransferEngine"]

log = logging.getLogger(__name__)

OK: Final = 0
FAILED: Final = -1
"""Mooncake's Transfer Engine answers -1 for any failed call of these."""
IO_TIMEOUT_S: Final = 30.0
MAX_CONNECTIONS: Final = 16
_REQUEST = struct.Struct("<cQQ")
_STATUS = struct.Struct("<i")
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class _Region:
    address: int
    length: int


def _split(hostname: str) -> tuple[str, int]:
    host, sep, port = hostname.rpartition(":")
    if sep and port.isdigit() and host:
        return host.strip("[]"), int(port)
    return hostname.strip("[]"), 0


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), _CHUNK))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


class TransferEngine:
    """`mooncake.engine.TransferEngine`'s host-memory calls over TCP (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[int, _Region] = {}
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._closed = threading.Event()

    # ------------------------------------------------------------------ set-up

    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str
    ) -> int:
        """Start serving this engine's registered memory on `local_hostname`'s host; 0, or -1
        when it is set up already or cannot listen there. `metadata_server`, `protocol` and
        `device_name` are accepted (P2PHANDSHAKE, TCP, no devices is what this offers)."""
        for name, value in (
            ("local_hostname", local_hostname),
            ("metadata_server", metadata_server),
            ("protocol", protocol),
            ("device_name", device_name),
        ):
            if not isinstance(value, str):
                raise TypeError(f"initialize(): {name} must be a str")
        if protocol.lower() not in ("tcp", ""):
            log.warning("TransferEngine: protocol %r; kvpool's shim moves bytes over TCP", protocol)
        host, port = _split(local_hostname)
        with self._lock:
            if self._listener is not None:
                log.error("TransferEngine.initialize: already initialized")
                return FAILED
            try:
                listener = socket.create_server((host or "127.0.0.1", port), backlog=64)
            except OSError as exc:
                log.error("TransferEngine.initialize(%r): %s", local_hostname, exc)
                return FAILED
            listener.settimeout(0.5)
            self._listener = listener
            self._thread = threading.Thread(
                target=self._serve, args=(listener,), name="kvpool-transfer-engine", daemon=True
            )
            self._thread.start()
        return OK

    def get_rpc_port(self) -> int:
        """The port peers reach this engine on (0 before `initialize`)."""
        listener = self._listener
        return int(listener.getsockname()[1]) if listener is not None else 0

    def close(self) -> None:
        """Stop serving (idempotent). Mooncake's engine stops when it is destroyed; this one's
        serving thread holds it, so an engine never closed serves until the process ends."""
        self._closed.set()
        with self._lock:
            listener, self._listener = self._listener, None
            thread, self._thread = self._thread, None
        if listener is not None:
            listener.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def get_engine(self) -> object:
        raise NotImplementedError(
            "kvpool's mooncake.engine has no C++ Transfer Engine to hand out (docs/compat.md)"
        )

    # ------------------------------------------------------------------ memory

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Let peers write and read [buffer_addr, buffer_addr + capacity); 0, or -1 for an
        empty or overlapping region."""
        addr, n = int(buffer_addr), int(capacity)
        if addr <= 0 or n <= 0:
            log.error("register_memory(%#x, %d): empty region", addr, n)
            return FAILED
        with self._lock:
            for r in self._regions.values():
                if addr < r.address + r.length and r.address < addr + n:
                    log.error("register_memory(%#x, %d): overlaps %#x", addr, n, r.address)
                    return FAILED
            self._regions[addr] = _Region(addr, n)
        return OK

    def unregister_memory(self, buffer_addr: int) -> int:
        with self._lock:
            return OK if self._regions.pop(int(buffer_addr), None) is not None else FAILED

    def batch_register_memory(
        self, buffer_addresses: list[int], capacities: list[int], location: str = "*"
    ) -> int:
        if len(buffer_addresses) != len(capacities):
            return FAILED
        pairs = zip(buffer_addresses, capacities, strict=True)
        codes = [self.register_memory(a, n, location) for a, n in pairs]
        return next((c for c in codes if c != OK), OK)

    def batch_unregister_memory(self, buffer_addresses: list[int]) -> int:
        codes = [self.unregister_memory(a) for a in buffer_addresses]
        return next((c for c in codes if c != OK), OK)

    def _region_of(self, addr: int, n: int) -> _Region | None:
        with self._lock:
            for r in self._regions.values():
                if r.address <= addr and addr + n <= r.address + r.length:
                    return r
        return None

    # ------------------------------------------------------------------ transfers

    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Copy `length` bytes at local `buffer` to `peer_buffer_address` of the engine at
        `target_hostname` ("host:port"); 0 or -1."""
        return self.batch_transfer_sync_write(
            target_hostname, [buffer], [peer_buffer_address], [length]
        )

    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int:
        """Copy `length` bytes at the peer's `peer_buffer_address` to local `buffer`; 0 or -1."""
        return self.batch_transfer_sync_read(
            target_hostname, [buffer], [peer_buffer_address], [length]
        )

    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._batch(b"W", target_hostname, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: list[int],
        peer_buffer_addresses: list[int],
        lengths: list[int],
        transport_hint: str = "",
    ) -> int:
        return self._batch(b"R", target_hostname, buffers, peer_buffer_addresses, lengths)

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the engine at `peer_server_name` answers, else -1."""
        return self._batch(b"P", peer_server_name, [0], [0], [0])

    def _batch(
        self, op: bytes, target: str, local: list[int], remote: list[int], lengths: list[int]
    ) -> int:
        if not isinstance(target, str) or not len(local) == len(remote) == len(lengths):
            log.error('TransferEngine: a target "host:port" and lists of one length expected')
            return FAILED
        host, port = _split(target)
        if port == 0:
            log.error("TransferEngine: %r names no port", target)
            return FAILED
        try:
            with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
                for buf, addr, n in zip(local, remote, lengths, strict=True):
                    if int(n) < 0:
                        return FAILED
                    if not self._one(sock, op, int(buf), int(addr), int(n)):
                        return FAILED
        except (OSError, ConnectionError) as exc:
            log.error("TransferEngine %s %s: %s", op.decode(), target, exc)
            return FAILED
        return OK

    @staticmethod
    def _one(sock: socket.socket, op: bytes, buf: int, addr: int, n: int) -> bool:
        sock.sendall(_REQUEST.pack(op, addr, n))
        if op == b"W" and n:
            sock.sendall(ctypes.string_at(buf, n))
        (status,) = _STATUS.unpack(_recv_exact(sock, _STATUS.size))
        if status != OK:
            log.error("TransferEngine: the peer refused %s of %d bytes at %#x", op, n, addr)
            return False
        if op == b"R" and n:
            ctypes.memmove(buf, _recv_exact(sock, n), n)
        return True

    # ------------------------------------------------------------------ serving

    def _serve(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                log.warning("TransferEngine: %d peers already; refusing one", MAX_CONNECTIONS)
                conn.close()
                continue
            threading.Thread(
                target=self._handle, args=(conn,), name="kvpool-transfer-peer", daemon=True
            ).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            while not self._closed.is_set():
                try:
                    head = conn.recv(_REQUEST.size, socket.MSG_WAITALL)
                except (TimeoutError, OSError):
                    return
                if len(head) != _REQUEST.size:
                    return  # the peer is done (or sent a malformed frame)
                op, addr, n = _REQUEST.unpack(head)
                if op == b"P":
                    conn.sendall(_STATUS.pack(OK))
                    continue
                if op not in (b"W", b"R") or (n and self._region_of(addr, n) is None):
                    log.warning("TransferEngine: refused %r of %d bytes at %#x", op, n, addr)
                    conn.sendall(_STATUS.pack(FAILED))
                    return  # a write's payload follows: the stream cannot be resynced
                if op == b"W":
                    data = _recv_exact(conn, n)
                    if n and self._region_of(addr, n) is None:  # unregistered meanwhile
                        conn.sendall(_STATUS.pack(FAILED))
                        return
                    ctypes.memmove(addr, data, n)
                    conn.sendall(_STATUS.pack(OK))
                else:
                    conn.sendall(_STATUS.pack(OK) + (ctypes.string_at(addr, n) if n else b""))
        except (OSError, ConnectionError) as exc:
            log.debug("TransferEngine peer: %s", exc)
        finally:
            conn.close()
            self._slots.release()
