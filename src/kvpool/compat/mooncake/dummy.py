"""The link between a dummy client (`setup_dummy`) and its standalone client process.

Mooncake runs one long-lived "real" client per host (`mooncake_client`) that owns the memory
segment, and engine processes attach "dummy" clients to it with
`setup_dummy(mem_pool_size, local_buffer_size, "127.0.0.1:50052")`; a Mooncake dummy then
forwards every call to the real client. In kvpool any process can talk to the master and to the
segments of its host directly (same-host segments are shared memory), so a dummy forwards
nothing: it attaches to the standalone client (`kvpool.compat.mooncake_client`) to learn the
pool it serves (master address, tenant) and to be known there, then runs as a client of that
pool contributing no memory, with a `mem_pool_size` pool of registered memory of its own for
`alloc_from_mem_pool`. Data still lands in the standalone client's segment (it is the memory
this host contributes), copied once from the dummy's memory through shared memory.

The protocol is newline-delimited JSON over the standalone client's abstract Unix socket
`@mooncake_client_<port>.sock` (Mooncake's name; tried first for a loopback address) or TCP::

    → {"op": "attach", "version": 1, "pid": PID}
    ← {"ok": true, "version": 1, "master": "HOST:PORT", "tenant": "default", "hostname": ...}
    → {"op": "ping"}                 every `PING_INTERVAL` s
    ← {"ok": true}

The standalone client counts a dummy whose connection closed, or that stayed silent for
`SILENT_AFTER` s, as gone. A dummy whose standalone client went away keeps serving (its pool
is the master's) and re-attaches in the background once one serves the address again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import BinaryIO

from kvpool.errors import InvalidParams, KVPoolError

__all__ = [
    "PING_INTERVAL",
    "SILENT_AFTER",
    "AttachInfo",
    "DummyLink",
    "read_message",
    "unix_name",
    "write_message",
]

log = logging.getLogger(__name__)

VERSION = 1
PING_INTERVAL = 1.0
SILENT_AFTER = 10.0
MAX_LINE = 64 << 10
CONNECT_TIMEOUT = 5.0


def unix_name(port: int) -> str:
    """The abstract Unix socket of the standalone client serving `port` (Mooncake's name)."""
    return f"\0mooncake_client_{port}.sock"


def write_message(sock: socket.socket, message: dict[str, object]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def read_message(reader: BinaryIO, limit: int = MAX_LINE) -> dict[str, object]:
    """One JSON object from a line of `reader` (a file made by `socket.makefile("rb")`);
    EOFError at the end of the stream, ValueError for anything but a JSON object."""
    line = reader.readline(limit + 1)
    if not line:
        raise EOFError("connection closed")
    if len(line) > limit:
        raise ValueError("message too long")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("message is not a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class AttachInfo:
    """What a standalone client tells a dummy that attaches."""

    master: str
    tenant: str
    hostname: str


def _connect(address: str, timeout: float) -> socket.socket:
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidParams(f"server_address: expected HOST:PORT, got {address!r}")
    port = int(port_text)
    host = host.strip("[]") or "127.0.0.1"
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.settimeout(timeout)
        try:
            unix.connect(unix_name(port))
            return unix
        except OSError:
            unix.close()
    return socket.create_connection((host, port), timeout=timeout)


class DummyLink:
    """A dummy client's attachment to its standalone client (module docstring).

    `attach()` connects and attaches once (KVPoolError when nothing serves the address); the
    link then pings from a daemon thread and re-attaches after a loss until `close()`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.info: AttachInfo | None = None
        self.attached = threading.Event()
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def attach(self, timeout: float = CONNECT_TIMEOUT) -> AttachInfo:
        info = self._attach_once(timeout)
        self.info = info
        self._thread = threading.Thread(target=self._run, name="mooncake-dummy-link", daemon=True)
        self._thread.start()
        return info

    def _attach_once(self, timeout: float) -> AttachInfo:
        try:
            sock = _connect(self.address, timeout)
        except OSError as exc:
            raise KVPoolError(f"no standalone client serves {self.address}: {exc}") from exc
        try:
            sock.settimeout(timeout)
            write_message(sock, {"op": "attach", "version": VERSION, "pid": os.getpid()})
            reply = read_message(sock.makefile("rb"))
            if not reply.get("ok"):
                raise KVPoolError(f"{self.address} refused the attach: {reply.get('error')}")
            info = AttachInfo(
                str(reply["master"]), str(reply.get("tenant", "default")), str(reply["hostname"])
            )
        except (OSError, EOFError, ValueError, KeyError) as exc:
            sock.close()
            raise KVPoolError(f"attach to {self.address} failed: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        with self._lock:
            if self._closed.is_set():
                sock.close()
                raise KVPoolError("the dummy client is closed")
            self._sock = sock
        self.attached.set()
        return info

    def _run(self) -> None:
        backoff = 0.1
        while not self._closed.is_set():
            sock = self._sock
            if sock is not None:
                try:
                    reader = sock.makefile("rb")
                    while not self._closed.wait(PING_INTERVAL):
                        write_message(sock, {"op": "ping"})
                        read_message(reader)
                except (OSError, EOFError, ValueError):
                    pass
                with self._lock:
                    self._sock = None
                sock.close()
                self.attached.clear()
                if self._closed.is_set():
                    return
                log.warning("the standalone client at %s went away; re-attaching", self.address)
            try:
                self._attach_once(CONNECT_TIMEOUT)
                backoff = 0.1
                log.info("re-attached to the standalone client at %s", self.address)
            except KVPoolError:
                if self._closed.wait(backoff):
                    return
                backoff = min(2.0, backoff * 2)

    def close(self) -> None:
        """Detach (the standalone client sees the connection close). Idempotent."""
        self._closed.set()
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
