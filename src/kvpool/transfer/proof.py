"""Admission to a transfer server: the challenge it sends and the proof a client answers.

A `TransferServer` given a data key (`KeySource`: a callable, so a node picks up the key its
master hands it, `kvpool.rpc.auth.data_key_for`) admits a connection only after it proved that
key (docs/security.md, "Data plane"). At accept the server sends a challenge, and serves
nothing until the client's first bytes are the proof:

    hello     (8 bytes, client → server, at connect): b"KVHELLO1"
    challenge (36 bytes, server → client): b"KVC1" | nonce (32 random bytes)
    proof     (36 bytes, client → server): b"KVA1" | HMAC-SHA256(key, "kvpool-xfer-v1" || nonce)

The client's hello goes out before it waits for the challenge, so a plain client that reached a
TLS server (which waits for a ClientHello) is refused at once instead of both sides waiting.

Nothing else is answered on a connection that did not prove the key: a wrong or missing proof
(a request header in its place, say) closes it without a byte, so a prober learns no size, no
segment name, no error code. The key never crosses the wire here, and a recorded proof is
worth nothing on another connection (a new nonce). A client whose connection is refused by
the server's caps reads a refusal (`RESP_MAGIC`, request id 0) instead of a challenge.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import Final

__all__ = [
    "CHALLENGE",
    "CHALLENGE_MAGIC",
    "HELLO",
    "NONCE_BYTES",
    "PROOF",
    "PROOF_MAGIC",
    "KeySource",
    "data_proof",
]

#: Bytes of the server's nonce.
NONCE_BYTES: Final = 32
CHALLENGE: Final = struct.Struct("<4s32s")
PROOF: Final = struct.Struct("<4s32s")
CHALLENGE_MAGIC: Final = b"KVC1"
PROOF_MAGIC: Final = b"KVA1"
#: What a client with a key sends at connect, before the challenge arrives.
HELLO: Final = b"KVHELLO1"  # longer than a TLS record header: a TLS server refuses it at once
_DOMAIN: Final = b"kvpool-xfer-v1\0"

#: Where a server or a client finds the data key now (None: no credentials, no challenge).
KeySource = Callable[[], bytes | None]


def data_proof(key: bytes, nonce: bytes) -> bytes:
    """The proof message for `nonce` (magic included), made with `key`."""
    return PROOF.pack(PROOF_MAGIC, hmac.new(key, _DOMAIN + nonce, hashlib.sha256).digest())
