"""Credentials of the RPC plane: who a connection proved to be, and the table it is checked in.

A `TokenTable` maps each token's public id (`kvpool.protocol.handshake.token_key_id`) to the
token and its `Principal` (tenant, role). `RpcServer` given a table challenges every connection
(the handshake in `kvpool.protocol.handshake`) and records the `Principal` on the `Connection`;
what a principal may do is the service's business (`kvpool.master.auth`). `replace()` swaps the
table's contents in one assignment (a reload on SIGHUP): connections already proven keep the
principal they proved, new ones meet the new tokens.

`client_token` reads the token a client presents, with the precedence explicit > file > env.

The data key (docs/security.md, "Data plane"): the secret a node's transfer server makes every
connection prove (`kvpool.transfer.proof`). Each master derives it from its table
(`TokenTable.data_key`: an HMAC over the admin tokens, or over every token when none is
admin, bound to the cluster id), so the masters of an HA group, which read one auth file,
agree on it. The server hands it to every proven connection in its second `Welcome`, wrapped
(`wrap_data_key`: XOR with an HMAC of the connection's token and nonce, so it never crosses
the wire in clear and a recorded Welcome is worthless without the token); the client unwraps
it (`unwrap_data_key`) and proves it to transfer servers; a node's server checks it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from kvpool.config import env
from kvpool.errors import InvalidParams
from kvpool.protocol.handshake import AUTH_NONCE_BYTES, Proof, auth_proof, token_key_id

__all__ = [
    "TOKEN_ENV",
    "Principal",
    "Role",
    "TokenTable",
    "client_token",
    "unwrap_data_key",
]

#: The environment variable a client reads its token from when given none otherwise.
TOKEN_ENV: Final = "KVPOOL_AUTH_TOKEN"
_DATA_KEY_DOMAIN: Final = b"kvpool-data-key-v1\0"
_DATA_WRAP_DOMAIN: Final = b"kvpool-data-wrap-v1"
#: Shortest token accepted: a token is a shared secret, and a short one is guessed offline
#: from one recorded proof.
MIN_TOKEN_BYTES: Final = 16


class Role(StrEnum):
    """What a token may do (docs/security.md has the table)."""

    CLIENT = "client"
    NODE = "node"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    """The identity a connection proved: the tenant it acts in and its role."""

    tenant: str
    role: Role
    #: The token's public id (`token_key_id`), for logs: never the token.
    key_id: str = ""

    @property
    def admin(self) -> bool:
        return self.role is Role.ADMIN


class TokenTable:
    """The tokens a server accepts. Not thread-safe: used on the server's loop."""

    def __init__(self, entries: Iterable[tuple[bytes, Principal]] = ()) -> None:
        self._by_id: dict[bytes, tuple[bytes, Principal]] = {}
        self.replace(entries)

    def replace(self, entries: Iterable[tuple[bytes, Principal]]) -> None:
        """Accept exactly `entries` from now on (validated first: on error nothing changes)."""
        table: dict[bytes, tuple[bytes, Principal]] = {}
        for token, principal in entries:
            if len(token) < MIN_TOKEN_BYTES:
                raise InvalidParams(
                    f"a token of tenant {principal.tenant!r} has {len(token)} bytes; "
                    f"at least {MIN_TOKEN_BYTES} are needed"
                )
            kid = token_key_id(token)
            if kid in table:
                raise InvalidParams(f"a token of tenant {principal.tenant!r} is listed twice")
            table[kid] = (token, Principal(principal.tenant, principal.role, kid.hex()[:12]))
        self._by_id = table
        admins = sorted(t for t, p in table.values() if p.role is Role.ADMIN)
        material = admins or sorted(t for t, _ in table.values())
        self._data_secret = hashlib.sha256(b"\0".join([_DATA_KEY_DOMAIN, *material])).digest()

    def data_key(self, cluster_id: str) -> bytes:
        """The data-plane key of `cluster_id` (see the module docstring): the same for every
        table of the same admin tokens (or, without admins, of the same tokens)."""
        return hmac.new(self._data_secret, cluster_id.encode(), hashlib.sha256).digest()

    def wrap_data_key(
        self, key_id: bytes, nonce: bytes, cluster_id: str, client_name: str
    ) -> bytes:
        """The data key as the connection that proved token `key_id` for `nonce` gets it."""
        entry = self._by_id.get(key_id)
        if entry is None:
            return b""
        pad = _wrap_pad(entry[0], nonce, cluster_id, client_name)
        return bytes(a ^ b for a, b in zip(self.data_key(cluster_id), pad, strict=True))

    def __len__(self) -> int:
        return len(self._by_id)

    @staticmethod
    def challenge() -> bytes:
        return secrets.token_bytes(AUTH_NONCE_BYTES)

    def verify(
        self, proof: Proof, nonce: bytes, cluster_id: str, client_name: str
    ) -> Principal | None:
        """The principal whose token made `proof` for `nonce`, or None."""
        entry = self._by_id.get(proof.key_id)
        if entry is None:
            return None
        token, principal = entry
        expected = auth_proof(token, nonce, cluster_id, client_name)
        return principal if hmac.compare_digest(expected, proof.mac) else None

    def principal_of(self, token: bytes) -> Principal | None:
        """The principal of the token itself (a Bearer token of the master's admin HTTP API,
        `kvpool.ops.admin`), or None; compared in constant time."""
        entry = self._by_id.get(token_key_id(token))
        if entry is None or not hmac.compare_digest(entry[0], token):
            return None
        return entry[1]

    def first(self, role: Role) -> bytes | None:
        """A token of `role` (an HA master dials its leader with the first admin token)."""
        for token, principal in self._by_id.values():
            if principal.role is role:
                return token
        return None


def client_token(
    token: str | bytes | None = None, token_file: str | os.PathLike[str] | None = None
) -> bytes | None:
    """The token a client presents: `token`, else the first line of `token_file`, else
    ``$KVPOOL_AUTH_TOKEN``; None when none is set (surrounding whitespace is dropped)."""
    if token:
        return token.encode() if isinstance(token, str) else bytes(token)
    if token_file:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as exc:
            raise InvalidParams(f"token file {token_file}: {exc}") from exc
        if not text:
            raise InvalidParams(f"token file {token_file} is empty")
        return text.splitlines()[0].strip().encode()
    value = (env("AUTH_TOKEN") or "").strip()  # TOKEN_ENV
    return value.encode() if value else None


def _wrap_pad(token: bytes, nonce: bytes, cluster_id: str, client_name: str) -> bytes:
    msg = b"\0".join((_DATA_WRAP_DOMAIN, nonce, cluster_id.encode(), client_name.encode()))
    return hmac.new(token, msg, hashlib.sha256).digest()


def unwrap_data_key(
    wrapped: bytes, token: bytes, nonce: bytes, cluster_id: str, client_name: str
) -> bytes | None:
    """The data key a `Welcome` carried (`TokenTable.wrap_data_key`), or None when it carried
    none (a server without credentials, or of an older version)."""
    if len(wrapped) != hashlib.sha256().digest_size:
        return None
    pad = _wrap_pad(token, nonce, cluster_id, client_name)
    return bytes(a ^ b for a, b in zip(wrapped, pad, strict=True))
