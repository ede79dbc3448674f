"""Object keys of the engine-side cache and the token-chunk hasher that makes them.

An `ObjectKey` names one KV chunk of one model slice: (model_name, kv_rank, chunk_hash, plus
object_group_id and cache_salt as LMCache's newer API has them). It is validated on
construction, so every adapter can trust it, and it has one canonical string form
(`to_string`) that survives any model name: the free-text fields are percent-encoded to
[A-Za-z0-9._~-], so "/", "@", spaces or non-ASCII in a model name never become path separators
or field separators.

`TokenHasher` turns token ids into chunk hashes: chunks of `chunk_size` tokens, only full chunks,
each hash chaining the previous one (so a hash names the whole prefix up to its chunk). It uses
BLAKE2b over explicit little-endian bytes and never Python's `hash()`: LMCache's default
("builtin") hash changes with PYTHONHASHSEED, and its users lose every cross-process hit to it
(LMCache #1095, #1139, #2979). The same tokens give the same keys in every process and machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote

import numpy as np

from kvpool.errors import InvalidParams

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ObjectKey",
    "TokenHasher",
    "compute_kv_rank",
]

DEFAULT_CHUNK_SIZE: Final = 256
MAX_MODEL_NAME_CHARS: Final = 256
MAX_SALT_CHARS: Final = 128
MAX_HASH_BYTES: Final = 64
_SAFE: Final = "-._~"  # with letters and digits: what percent-encoding leaves alone


def _encode(text: str) -> str:
    return quote(text, safe=_SAFE)


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """One KV chunk of one model slice. Immutable and hashable; validated on construction."""

    model_name: str
    kv_rank: int
    chunk_hash: bytes
    object_group_id: int = 0
    cache_salt: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise InvalidParams(
                f"ObjectKey.model_name must be a non-empty str, got {self.model_name!r}"
            )
        if len(self.model_name) > MAX_MODEL_NAME_CHARS or "\x00" in self.model_name:
            raise InvalidParams(
                f"ObjectKey.model_name must be at most {MAX_MODEL_NAME_CHARS} chars without NUL, "
                f"got {self.model_name[:40]!r}... ({len(self.model_name)} chars)"
            )
        if isinstance(self.kv_rank, bool) or not isinstance(self.kv_rank, int):
            raise InvalidParams(f"ObjectKey.kv_rank must be an int, got {self.kv_rank!r}")
        if not 0 <= self.kv_rank < 1 << 32:
            raise InvalidParams(f"ObjectKey.kv_rank must be in [0, 2**32), got {self.kv_rank}")
        if (
            not isinstance(self.chunk_hash, bytes)
            or not 1 <= len(self.chunk_hash) <= MAX_HASH_BYTES
        ):
            raise InvalidParams(
                f"ObjectKey.chunk_hash must be 1..{MAX_HASH_BYTES} bytes, got {self.chunk_hash!r}"
            )
        if isinstance(self.object_group_id, bool) or not isinstance(self.object_group_id, int):
            raise InvalidParams(
                f"ObjectKey.object_group_id must be an int, got {self.object_group_id!r}"
            )
        if not 0 <= self.object_group_id < 1 << 16:
            raise InvalidParams(
                f"ObjectKey.object_group_id must be in [0, 65536), got {self.object_group_id}"
            )
        if not isinstance(self.cache_salt, str) or len(self.cache_salt) > MAX_SALT_CHARS:
            raise InvalidParams(
                f"ObjectKey.cache_salt must be a str of at most {MAX_SALT_CHARS} chars, "
                f"got {self.cache_salt!r}"
            )
        if "\x00" in self.cache_salt:
            raise InvalidParams("ObjectKey.cache_salt must not contain NUL")

    @property
    def group(self) -> tuple[str, int]:
        """(model_name, kv_rank): keys of one group share shape and dtype (one store batch)."""
        return (self.model_name, self.kv_rank)

    def to_string(self) -> str:
        """`<model>@<kv_rank:08x>@<group:x>@<hash hex>[@<salt>]`, model and salt percent-encoded.

        The result contains only [A-Za-z0-9._~%@-], is unique per key, and `from_string`
        inverts it.
        """
        s = f"{_encode(self.model_name)}@{self.kv_rank:08x}@{self.object_group_id:x}@{self.chunk_hash.hex()}"
        if self.cache_salt:
            s += "@" + _encode(self.cache_salt)
        return s

    @classmethod
    def from_string(cls, text: str) -> ObjectKey:
        parts = text.split("@")
        if len(parts) not in (4, 5):
            raise InvalidParams(f"not an ObjectKey string: {text!r}")
        try:
            return cls(
                model_name=unquote(parts[0], errors="strict"),
                kv_rank=int(parts[1], 16),
                object_group_id=int(parts[2], 16),
                chunk_hash=bytes.fromhex(parts[3]),
                cache_salt=unquote(parts[4], errors="strict") if len(parts) == 5 else "",
            )
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidParams(f"not an ObjectKey string: {text!r}") from exc

    def __repr__(self) -> str:
        return f"ObjectKey({self.to_string()})"


def compute_kv_rank(
    world_size: int, global_rank: int, local_world_size: int, local_rank: int
) -> int:
    """LMCache's packing of a worker's position into one kv_rank (8 bits per field)."""
    fields = {
        "world_size": world_size,
        "global_rank": global_rank,
        "local_world_size": local_world_size,
        "local_rank": local_rank,
    }
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 256:
            raise InvalidParams(
                f"compute_kv_rank: {name} must be an int in [0, 256), got {value!r}"
            )
    if global_rank >= world_size or local_rank >= local_world_size:
        raise InvalidParams(
            f"compute_kv_rank: rank outside world ({global_rank}/{world_size}, {local_rank}/{local_world_size})"
        )
    return (world_size << 24) | (global_rank << 16) | (local_world_size << 8) | local_rank


class TokenHasher:
    """Chained chunk hashes of token ids, identical in every process.

    h_0 = BLAKE2b(person="kvpool-none", salt=namespace); h_i = BLAKE2b(h_{i-1} || tokens_i as
    u32 little-endian). Only full chunks are hashed: a trailing partial chunk has no key (its KV
    is recomputed), which is what makes a key stand for exactly `chunk_size` tokens.
    """

    __slots__ = ("_chunk_size", "_digest_size", "_root")

    def __init__(
        self, chunk_size: int = DEFAULT_CHUNK_SIZE, *, digest_size: int = 16, namespace: str = ""
    ) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise InvalidParams(f"TokenHasher.chunk_size must be an int >= 1, got {chunk_size!r}")
        if not 8 <= digest_size <= 64:
            raise InvalidParams(f"TokenHasher.digest_size must be in [8, 64], got {digest_size!r}")
        self._chunk_size = chunk_size
        self._digest_size = digest_size
        # The namespace lets two deployments that must never share a prefix (different tokenizers
        # under one model name) keep their keys apart; the empty namespace is the default.
        self._root = hashlib.blake2b(
            namespace.encode(), digest_size=digest_size, person=b"kvpool-none"
        ).digest()

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    @property
    def none_hash(self) -> bytes:
        """The hash that the first chunk chains from."""
        return self._root

    def chunk_hashes(
        self, tokens: Sequence[int] | np.ndarray, prefix_hash: bytes | None = None
    ) -> list[bytes]:
        """One hash per full chunk of `tokens`, chained from `prefix_hash` (default: none_hash)."""
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise InvalidParams(f"tokens must be one-dimensional, got shape {arr.shape}")
        if arr.size and (
            arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= 1 << 32
        ):
            raise InvalidParams("tokens must be integers in [0, 2**32)")
        data = arr.astype("<u4", copy=False).tobytes()
        step = self._chunk_size * 4
        prev = self._root if prefix_hash is None else prefix_hash
        out: list[bytes] = []
        for start in range(0, len(data) - step + 1, step):
            h = hashlib.blake2b(prev, digest_size=self._digest_size)
            h.update(data[start : start + step])
            prev = h.digest()
            out.append(prev)
        return out

    def keys(
        self,
        model_name: str,
        kv_rank: int,
        tokens: Sequence[int] | np.ndarray,
        *,
        object_group_id: int = 0,
        cache_salt: str = "",
    ) -> list[ObjectKey]:
        """The ObjectKeys of every full chunk of `tokens` for one model slice."""
        return [
            ObjectKey(model_name, kv_rank, h, object_group_id, cache_salt)
            for h in self.chunk_hashes(tokens)
        ]
