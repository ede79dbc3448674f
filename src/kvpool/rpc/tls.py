"""TLS for kvpool's TCP listeners and their clients (docs/security.md, "TLS").

`TlsConfig` names the PEM files of one process: its certificate and key (a server presents
them; a client presents them when the server asks, mutual TLS) and the CA bundle it trusts.
One process has one identity: a node serves its transfer server and dials its master with the
same certificate. `server_context()` / `client_context()` build the `ssl.SSLContext`s the
listeners (`kvpool.rpc.server.RpcServer`, `kvpool.transfer.server.TransferServer`) and the
clients (`kvpool.rpc.client.RpcClient`, `kvpool.transfer.tcp.TcpTransport`) take.

Rules:

* a server needs ``cert`` and ``key``; with ``ca`` too it requires and verifies a client
  certificate signed by that CA (mutual TLS), without it any client may connect (and prove a
  token, when the pool has credentials);
* a client needs ``ca`` (the server's certificate is verified, host name included: put the
  address clients dial, e.g. ``IP:10.0.0.5`` or ``DNS:node-3``, in its subjectAltName); with
  ``cert`` and ``key`` it presents them when asked;
* TLS 1.2 at least; Python's defaults for ciphers.

The abstract Unix socket and shared memory stay plain (same host; docs/security.md says who can
reach them). Precedence for a client's files: explicit arguments, then ``$KVPOOL_TLS_CA``,
``$KVPOOL_TLS_CERT``, ``$KVPOOL_TLS_KEY`` (`TlsConfig.resolve`).
"""

from __future__ import annotations

import select
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kvpool.config import env
from kvpool.errors import InvalidParams

__all__ = ["TlsConfig", "TlsStream"]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files of one process; "" for a file not given."""

    cert: str = ""
    """This process's certificate chain (a server's always; a client's for mutual TLS)."""
    key: str = ""
    """The private key of `cert`."""
    ca: str = ""
    """The CA bundle trusted: a client verifies servers with it; a server given it requires
    client certificates signed by it (mutual TLS)."""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise InvalidParams("TLS: a certificate needs its key and a key its certificate")
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise InvalidParams(f"TLS {name} file {path!r} does not exist")

    @classmethod
    def resolve(
        cls, cert: str | None = None, key: str | None = None, ca: str | None = None
    ) -> TlsConfig | None:
        """The files given, else the environment's; None when neither names any."""
        cert = cert or env("TLS_CERT") or ""
        key = key or env("TLS_KEY") or ""
        ca = ca or env("TLS_CA") or ""
        if not (cert or key or ca):
            return None
        return cls(str(cert), str(key), str(ca))

    @property
    def mutual(self) -> bool:
        """Whether a server of this config requires client certificates."""
        return bool(self.ca)

    def server_context(self) -> ssl.SSLContext:
        """The context a listener wraps accepted connections with."""
        if not self.cert:
            raise InvalidParams("TLS: a server needs --tls-cert and --tls-key")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # No TLS 1.3 session tickets: clients keep their connections (nothing to resume), and
        # a ticket arriving after the handshake makes a client's read write too, while another
        # of its threads may be sending (the RPC client reads and sends from different threads).
        ctx.num_tickets = 0
        self._load(ctx)
        if self.ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context a client wraps its connections with (verifies the server)."""
        if not self.ca:
            raise InvalidParams("TLS: a client needs --tls-ca to verify the server")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(ctx)
        return ctx

    def _load(self, ctx: ssl.SSLContext) -> None:
        try:
            if self.cert:
                ctx.load_cert_chain(self.cert, self.key)
            if self.ca:
                ctx.load_verify_locations(cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidParams(f"TLS files do not load: {exc}") from exc


class TlsStream:
    """One TLS connection used by several threads at once: the RPC client's reader and its
    senders (`kvpool.rpc.client`).

    OpenSSL does not allow one connection to be read and written by two threads at the same
    time, and on a blocking socket the ssl module retries a read that a kernel timeout ended,
    inside C, for ever. So the socket is made non-blocking, every ssl call is made under
    `lock` (held only for the call, never while waiting), and waiting for the socket happens
    outside it with poll(): a sender never waits behind a reader that waits for a reply.
    """

    __slots__ = ("_in", "_out", "lock", "sock")

    def __init__(self, sock: ssl.SSLSocket) -> None:
        sock.settimeout(0.0)
        self.sock = sock
        self.lock = threading.Lock()
        self._in = select.poll()
        self._in.register(sock.fileno(), select.POLLIN)
        self._out = select.poll()
        self._out.register(sock.fileno(), select.POLLOUT | select.POLLIN)

    def recv(self, nbytes: int, timeout: float) -> bytes | None:
        """Up to `nbytes` decrypted bytes; b"" at EOF; None when none came within `timeout`."""
        sock = self.sock
        with self.lock:
            buffered = sock.pending()
        if not buffered and not self._in.poll(max(0, int(timeout * 1000))):
            return None
        with self.lock:
            try:
                return sock.recv(nbytes)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None  # a record not complete yet (or a protocol message): wait on

    def sendall(self, data: bytes, timeout: float) -> None:
        """Send all of `data` (the caller serializes whole frames); TimeoutError when the
        peer takes none of it for `timeout` seconds."""
        view = memoryview(data)
        deadline = time.monotonic() + timeout
        while view:
            with self.lock:
                try:
                    n = self.sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    n = 0
            if n:
                view = view[n:]
                deadline = time.monotonic() + timeout
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the peer took no byte in {timeout:g} s")
            self._out.poll(max(1, int(min(left, 0.05) * 1000)))
