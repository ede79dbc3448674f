"""The handshake that opens every control-plane connection: `Hello` → `Welcome` or refusal.

The client's first frame is a `Hello` with request id `HANDSHAKE_REQUEST_ID` (0); nothing else
may come first. The server answers with a `Welcome` on the same id, or with an `ErrorReply` and
closes the connection:

* ``protocol_version`` differs from the server's → ``INVALID_VERSION``;
* ``cluster_id`` differs from the server's → ``ILLEGAL_CLIENT``. A client from another cluster
  is a client this cluster does not know, which is what ILLEGAL_CLIENT means elsewhere in
  Mooncake; it also keeps INVALID_PARAMS for malformed input only. The later auth check (the
  ``auth`` slot) will refuse with ILLEGAL_CLIENT too.

The client checks the `Welcome` in turn (`check_welcome`), so a client that reached the wrong
cluster through a stale address fails at connect time, not on its first request.

Same-host transport: a server that also listens on a Linux abstract Unix socket names it in
``Welcome.unix_address`` (the name with its leading NUL, ``"\\0kvpool-rpc/..."``; empty when it
has none). A client on the same host (the same network namespace: an abstract name resolves
nowhere else) connects there, handshakes again, checks that the second `Welcome` names the same
address and cluster, and drops the TCP connection; on any failure it keeps TCP. The field is a
defaulted trailing one, so a `Welcome` of an older server still decodes (as "no Unix socket").

Authentication (docs/security.md): a server that holds credentials answers the Hello with a
`Welcome` whose ``challenge`` is a fresh random nonce (32 bytes), and serves nothing yet. The
client answers with a `Proof` frame on request id 0: the id of its token (`token_key_id`) and
``HMAC-SHA256(token, "kvpool-auth-v1" || nonce || cluster_id || client_name)`` (`auth_proof`),
so the token never crosses the wire and a recorded proof is worth nothing on another
connection. The server checks it against its token table and answers a second `Welcome`
(``challenge`` empty, ``tenant`` and ``role`` of the token) or refuses with UNAUTHENTICATED and
closes. A server without credentials answers as it always did: one `Welcome`, no challenge, no
extra round trip. A client without a token that meets a challenge fails with UNAUTHENTICATED.
The new fields trail their Structs with defaults, so older peers still decode them.

Both checks are pure functions here, so the rules live in one place and are tested without I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Final

import msgspec

from kvpool.errors import ErrorCode, KVPoolError, error_for_code
from kvpool.protocol.framing import ErrorReply

__all__ = [
    "AUTH_NONCE_BYTES",
    "HANDSHAKE_REQUEST_ID",
    "PROTOCOL_VERSION",
    "UNIX_ADDRESS_MAX_BYTES",
    "Hello",
    "Proof",
    "Welcome",
    "auth_proof",
    "check_hello",
    "check_unix_welcome",
    "check_welcome",
    "is_abstract_unix_address",
    "token_key_id",
]

#: The version of the framing, the handshake and the RPC rules. Bump on any incompatible change.
PROTOCOL_VERSION: Final = 1
#: The request id of the `Hello` frame and of its answer.
HANDSHAKE_REQUEST_ID: Final = 0
#: The most bytes of a Unix socket address, its leading NUL included (Linux's sun_path).
UNIX_ADDRESS_MAX_BYTES: Final = 108

#: Bytes of the server's challenge nonce.
AUTH_NONCE_BYTES: Final = 32
_AUTH_DOMAIN: Final = b"kvpool-auth-v1"

_Name = Annotated[str, msgspec.Meta(max_length=256)]


class Hello(msgspec.Struct, tag=True, frozen=True):
    """The client's first frame."""

    protocol_version: int
    cluster_id: _Name
    client_name: _Name = ""
    #: Proof of identity for the auth check of a later issue; ignored today.
    auth: Annotated[bytes, msgspec.Meta(max_length=4096)] = b""


class Welcome(msgspec.Struct, tag=True, frozen=True):
    """The server's answer to an accepted `Hello`."""

    protocol_version: int
    cluster_id: _Name
    server_name: _Name = ""
    #: The server's abstract Unix socket (leading NUL included), "" when it listens on none.
    unix_address: _Name = ""
    #: The leader term of an HA master when it answered (0: not HA, or not leading). A client
    #: that has seen term T refuses a master whose Welcome carries a lower non-zero term.
    term: int = 0
    #: Non-empty: the server needs a `Proof` for this nonce before it serves anything.
    challenge: Annotated[bytes, msgspec.Meta(max_length=256)] = b""
    #: The tenant and role of the token the connection proved ("" without credentials).
    tenant: _Name = ""
    role: _Name = ""
    #: The data-plane key, wrapped for this connection (`kvpool.rpc.auth.wrap_data_key`).
    data_key: Annotated[bytes, msgspec.Meta(max_length=64)] = b""


class Proof(msgspec.Struct, tag=True, frozen=True):
    """The client's answer to a `Welcome` with a challenge (request id 0)."""

    #: `token_key_id` of the token: which entry of the server's table to check against.
    key_id: Annotated[bytes, msgspec.Meta(max_length=64)]
    #: `auth_proof` of the token for the challenge.
    mac: Annotated[bytes, msgspec.Meta(max_length=64)]


def token_key_id(token: bytes) -> bytes:
    """A public name of `token` (16 bytes of a domain-separated SHA-256): lets the server find
    the token to check without trying each, and says nothing usable about the token itself."""
    return hashlib.sha256(b"kvpool-token-id\0" + token).digest()[:16]


def auth_proof(token: bytes, nonce: bytes, cluster_id: str, client_name: str) -> bytes:
    """HMAC-SHA256 of the challenge, bound to the cluster and the client's name."""
    msg = b"\0".join((_AUTH_DOMAIN, nonce, cluster_id.encode(), client_name.encode()))
    return hmac.new(token, msg, hashlib.sha256).digest()


def check_hello(
    hello: Hello, *, cluster_id: str, protocol_version: int = PROTOCOL_VERSION
) -> ErrorReply | None:
    """The refusal for `hello` at a server of `cluster_id`, or None when it is accepted."""
    if hello.protocol_version != protocol_version:
        return ErrorReply(
            int(ErrorCode.INVALID_VERSION),
            f"protocol version {hello.protocol_version} is not supported "
            f"(this server speaks {protocol_version})",
        )
    if hello.cluster_id != cluster_id:
        return ErrorReply(
            int(ErrorCode.ILLEGAL_CLIENT),
            f"cluster id {hello.cluster_id!r} does not match this server's cluster",
        )
    return None


def check_welcome(
    welcome: Welcome, *, cluster_id: str, protocol_version: int = PROTOCOL_VERSION
) -> KVPoolError | None:
    """The error a client raises for `welcome` when it expected `cluster_id`, or None."""
    if welcome.protocol_version != protocol_version:
        return error_for_code(
            ErrorCode.INVALID_VERSION,
            f"server {welcome.server_name!r} speaks protocol version {welcome.protocol_version}, "
            f"expected {protocol_version}",
        )
    if welcome.cluster_id != cluster_id:
        return error_for_code(
            ErrorCode.ILLEGAL_CLIENT,
            f"server {welcome.server_name!r} belongs to cluster {welcome.cluster_id!r}, "
            f"expected {cluster_id!r}",
        )
    return None


def is_abstract_unix_address(address: str) -> bool:
    """Whether `address` is a Linux abstract Unix socket name a client may connect to.

    Only abstract names (leading NUL) are followed: they leave no file behind and resolve only
    inside the client's own network namespace, so a `Welcome` can never point a client at a
    socket file elsewhere on its host.
    """
    return (
        len(address) > 1 and address[0] == "\0" and len(address.encode()) <= UNIX_ADDRESS_MAX_BYTES
    )


def check_unix_welcome(
    welcome: Welcome,
    *,
    cluster_id: str,
    unix_address: str,
    protocol_version: int = PROTOCOL_VERSION,
) -> KVPoolError | None:
    """The error for the `welcome` read over the Unix socket `unix_address` (which the TCP
    `Welcome` named), or None when it is the same server: same cluster, same address. With
    `unix_address` empty (the Welcome came over TCP) this is `check_welcome`."""
    problem = check_welcome(welcome, cluster_id=cluster_id, protocol_version=protocol_version)
    if problem is not None or not unix_address:
        return problem
    if welcome.unix_address != unix_address:
        return error_for_code(
            ErrorCode.RPC_FAIL,
            f"the Unix socket {unix_address!r} is served by {welcome.server_name!r}, which names "
            f"{welcome.unix_address!r}",
        )
    return None
