"""`Connector`: how an `RpcClient` (`kvpool.rpc.client`) opens a connection, and what the
handshake taught it.

Transport: the client always dials the server's TCP address (through TLS when it has a context,
`kvpool.rpc.tls`) and handshakes there. When the `Welcome` names an abstract Unix socket
(`RpcServer` listens on one by default) and the client's ``unix`` option is on (the default;
``KVPOOL_RPC_UNIX=0`` turns it off for every client), it connects to that socket, handshakes
again, checks that the second `Welcome` names the same socket and cluster, and drops the TCP
connection: a same-host round trip is then cheaper (docs/parts/perf-rpc.md). The name resolves
only on the server's host (in its network namespace), so a client elsewhere gets ECONNREFUSED at
once and keeps its TCP connection, as it does on any other failure of that attempt (refusal,
handshake error, half the time budget spent). Every reconnect, and the first call of a forked
child, goes through the same steps.

Credentials: when the `Welcome` carries a challenge, the connector answers with the proof of its
token (`proof_for`, shared with `kvpool.rpc.aio`) and unwraps the data-plane key the next
`Welcome` hands over (`kvpool.rpc.auth`). A `Welcome` whose non-zero leader term is below the
highest one seen (`min_term`) comes from a deposed leader and is refused with `NotLeader`.

The connector holds no connection: `open` returns a `Channel` (`kvpool.rpc.channel`) that the
client owns. The client serialises calls to `open` and `move` (its connect lock).
"""

from __future__ import annotations

import logging
import socket
import ssl
import time

import msgspec

from kvpool.config import env
from kvpool.errors import (
    ErrorCode,
    InvalidParams,
    KVPoolError,
    NotLeader,
    RpcError,
    Unauthenticated,
    error_for_code,
)
from kvpool.protocol.framing import (
    ERROR_FLAG,
    HEADER,
    MIN_FRAME_LENGTH,
    ErrorReply,
    FrameDecoder,
    FrameError,
)
from kvpool.protocol.handshake import (
    HANDSHAKE_REQUEST_ID,
    Hello,
    Proof,
    Welcome,
    auth_proof,
    check_unix_welcome,
    is_abstract_unix_address,
    token_key_id,
)
from kvpool.rpc.auth import unwrap_data_key
from kvpool.rpc.channel import RECV_BYTES, Channel

__all__ = [
    "Connector",
    "answer_welcome",
    "check_timeout",
    "parse_address",
    "proof_for",
    "unix_enabled",
    "welcome_of",
]

log = logging.getLogger(__name__)


def unix_enabled(unix: bool) -> bool:
    """A client's ``unix`` option as it applies: off when ``KVPOOL_RPC_UNIX=0``."""
    return bool(unix) and env("RPC_UNIX", "1") != "0"


def check_timeout(timeout: float) -> float:
    """`timeout` when it is a positive number of seconds; `InvalidParams` otherwise."""
    if not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidParams(f"timeout: {timeout!r} must be a positive number of seconds")
    return timeout


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` → (host, port); raises `InvalidParams` naming the bad value."""
    if not isinstance(address, str):
        raise InvalidParams(f"address: expected 'host:port', got {address!r}")
    host, sep, port_s = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise InvalidParams(f"address: expected 'host:port', got {address!r}")
    return host, int(port_s)


def proof_for(
    token: bytes | None, challenge: bytes, cluster_id: str, client_name: str, where: str
) -> Proof:
    """The answer to `challenge` (shared with the async client)."""
    if not token:
        raise Unauthenticated(
            f"{where} requires a token: pass token=..., --token-file, or set KVPOOL_AUTH_TOKEN"
        )
    return Proof(token_key_id(token), auth_proof(token, challenge, cluster_id, client_name))


_decode_refusal = msgspec.msgpack.Decoder(ErrorReply).decode


def welcome_of(request_id: int, payload: bytes, where: str) -> Welcome:
    """The `Welcome` in the server's answer to a handshake frame; when the server refused, the
    exception of the refusal's code (shared with `kvpool.rpc.aio`)."""
    if request_id & ERROR_FLAG:
        refusal = _decode_refusal(payload)
        raise error_for_code(refusal.code, f"{where} refused: {refusal.message}")
    return msgspec.msgpack.decode(payload, type=Welcome)


def answer_welcome(
    welcome: Welcome, hello: Hello, token: bytes | None, unix_address: str, where: str
) -> Proof | None:
    """Check `welcome`, the answer to `hello` (for the Unix socket `unix_address` when given;
    "" over TCP: the plain checks only), and raise its problem; then None when it admits the
    client, or the `Proof` of `token` its challenge asks for (shared with `kvpool.rpc.aio`)."""
    problem = check_unix_welcome(
        welcome,
        cluster_id=hello.cluster_id,
        unix_address=unix_address,
        protocol_version=hello.protocol_version,
    )
    if problem is not None:
        raise problem
    if not welcome.challenge:
        return None
    return proof_for(token, welcome.challenge, hello.cluster_id, hello.client_name, where)


class Connector:
    """Opens and handshakes the connections of one client (module docstring).

    ``address`` is ``"host:port"`` already parsed into ``host`` and ``port``; ``timeout`` is the
    send timeout of the channels it opens. The attributes the handshake sets (`server_name`,
    `auth_tenant`, `auth_role`, `data_key`, `server_term`, `min_term`) are the client's to read.
    """

    def __init__(
        self,
        address: str,
        host: str,
        port: int,
        *,
        cluster_id: str,
        client_name: str,
        timeout: float,
        max_frame_bytes: int,
        auth: bytes,
        protocol_version: int,
        unix: bool,
        token: bytes | None,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.address = address
        self._host, self._port = host, port
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self.unix = unix
        self.cluster_id = cluster_id
        self.client_name = client_name
        self.protocol_version = protocol_version
        self.max_frame_bytes = max_frame_bytes
        self._hello = Hello(protocol_version, cluster_id, client_name, auth)
        self._encode = msgspec.msgpack.Encoder().encode
        self.server_name = ""
        #: The tenant and role of the token the server accepted ("" without credentials).
        self.auth_tenant = self.auth_role = ""
        #: The data-plane key the master handed this client (None: no credentials).
        self.data_key: bytes | None = None
        #: The leader term in the last `Welcome` (0: not an HA master, or not leading).
        self.server_term = 0
        #: The highest leader term seen (set by the caller from discovery too): a server whose
        #: Welcome carries a non-zero term below it is a deposed leader and is refused with
        #: `NotLeader` (NOT_LEADER).
        self.min_term = 0

    def move(self, address: str, host: str, port: int) -> None:
        """Dial `address` (parsed into `host` and `port`) from the next `open` on."""
        self.address = address
        self._host, self._port = host, port

    def open(self, deadline: float) -> Channel:
        """Dial TCP and handshake; move to the server's Unix socket when it names one."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RpcError(f"timed out before connecting to {self.address}", ErrorCode.RPC_TIMEOUT)
        try:
            sock = socket.create_connection((self._host, self._port), timeout=remaining)
        except TimeoutError as exc:
            raise RpcError(
                f"connecting to {self.address} timed out", ErrorCode.RPC_TIMEOUT
            ) from exc
        except OSError as exc:
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:  # the TLS handshake, within the connect deadline
                sock = self.tls.wrap_socket(sock, server_hostname=self._host)
        except TimeoutError as exc:
            sock.close()
            raise RpcError(f"TLS with {self.address} timed out", ErrorCode.RPC_TIMEOUT) from exc
        except OSError as exc:
            sock.close()
            raise RpcError(f"cannot connect to {self.address}: {exc}") from exc
        welcome, decoder = self._handshake(sock, deadline, self.address)
        self.server_name = welcome.server_name
        self.auth_tenant, self.auth_role = welcome.tenant, welcome.role
        if welcome.term:
            if welcome.term < self.min_term:
                sock.close()
                raise NotLeader(
                    f"{self.address} answered as leader of term {welcome.term}, "
                    f"older than term {self.min_term} seen before",
                    ErrorCode.NOT_LEADER,
                )
            self.min_term = welcome.term
        self.server_term = welcome.term
        if self.unix and welcome.unix_address:
            try:
                unix = self._open_unix(welcome.unix_address, deadline)
            except BaseException:  # KeyboardInterrupt and the like: leave nothing open
                sock.close()
                raise
            if unix is not None:
                sock.close()  # no request went over it: the server just sees it close
                return Channel(unix[0], unix[1], self.timeout, "unix")
        return Channel(sock, decoder, self.timeout, "tcp")

    def _open_unix(self, name: str, deadline: float) -> tuple[socket.socket, FrameDecoder] | None:
        """A handshaken connection to the server's Unix socket `name`, or None (keep TCP)."""
        if not is_abstract_unix_address(name):
            log.warning(
                "%s advertises %r, not an abstract Unix socket: using TCP", self.address, name
            )
            return None
        # At most half of what is left: when this attempt fails, the call still has time
        # to run on the TCP connection.
        now = time.monotonic()
        budget = (deadline - now) / 2
        if budget <= 0:
            return None
        unix_deadline = now + budget
        where = f"{self.address} (unix {name[1:]!r})"
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:  # EMFILE and the like: the TCP connection still serves
            log.warning("no Unix socket for %s (%s): using TCP", where, exc)
            return None
        try:
            sock.settimeout(budget)
            sock.connect(name)
        except OSError as exc:
            sock.close()
            # ECONNREFUSED: another host or network namespace (the expected case), or a server
            # that closed its listener; either way TCP serves.
            log.debug("%s unreachable (%s): using TCP", where, exc)
            return None
        except BaseException:  # an interrupt: leave nothing open
            sock.close()
            raise
        try:
            _, decoder = self._handshake(sock, unix_deadline, where, unix_address=name)
        except KVPoolError as exc:
            log.warning("handshake with %s failed (%s): using TCP", where, exc)
            return None
        return sock, decoder

    def _handshake(
        self, sock: socket.socket, deadline: float, where: str, *, unix_address: str = ""
    ) -> tuple[Welcome, FrameDecoder]:
        """Send the Hello on `sock` and check the Welcome (for the Unix socket `unix_address`
        when given); `sock` is closed on any failure, which raises as a connect does."""
        try:
            decoder = FrameDecoder(self.max_frame_bytes)
            frames: list[tuple[int, bytes]] = []
            welcome = self._exchange(
                sock,
                decoder=decoder,
                frames=frames,
                deadline=deadline,
                where=where,
                message=self._hello,
            )
            for _ in range(2):
                proof = answer_welcome(welcome, self._hello, self.token, unix_address, where)
                if proof is None:
                    break
                nonce = welcome.challenge
                welcome = self._exchange(
                    sock,
                    decoder=decoder,
                    frames=frames,
                    deadline=deadline,
                    where=where,
                    message=proof,
                )
                if self.token is not None:  # the data-plane key (kvpool.rpc.auth)
                    key = unwrap_data_key(
                        welcome.data_key, self.token, nonce, self.cluster_id, self.client_name
                    )
                    self.data_key = key if key is not None else self.data_key
            else:
                raise RpcError(f"{where} challenged the proof of its own challenge")
        except FrameError as exc:
            sock.close()
            raise RpcError(f"bad frame from {where} during the handshake: {exc}") from exc
        except KVPoolError:
            sock.close()
            raise
        except TimeoutError as exc:
            sock.close()
            raise RpcError(f"handshake with {where} timed out", ErrorCode.RPC_TIMEOUT) from exc
        except (OSError, msgspec.DecodeError) as exc:
            sock.close()
            raise RpcError(f"handshake with {where} failed: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return welcome, decoder

    def _exchange(
        self,
        sock: socket.socket,
        *,
        decoder: FrameDecoder,
        frames: list[tuple[int, bytes]],
        deadline: float,
        where: str,
        message: Hello | Proof,
    ) -> Welcome:
        """Send one handshake frame and read the `Welcome` that answers it (raising the
        refusal when the server refuses)."""
        payload = self._encode(message)
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        sock.sendall(HEADER.pack(len(payload) + MIN_FRAME_LENGTH, HANDSHAKE_REQUEST_ID) + payload)
        while not frames:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ConnectionError("server closed the connection during the handshake")
            frames.extend(decoder.feed(data))
        request_id, payload = frames.pop(0)
        return welcome_of(request_id, payload, where)
