"""The self-checking record every byte-store adapter writes: header, key, payload.

    magic "KVPR" | u16 version | u16 key length | u64 payload length | u64 xxh3_64(key ‖ payload)
    | key (ObjectKey.to_string(), UTF-8) | payload

Loading verifies all of it before a byte reaches the caller's buffer: a torn write, a bit flip,
a truncated object, a value written under another key (an encoding collision, a misrouted
object) or a size that does not match the destination each read as a per-key load failure,
never as wrong bytes handed to the engine.
"""

from __future__ import annotations

import struct
from typing import Final

import xxhash

from kvpool.cache.keys import ObjectKey

__all__ = ["HEADER", "RecordError", "decode_into", "encode_parts"]

MAGIC: Final = b"KVPR"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sHHQQ")


class RecordError(ValueError):
    """The stored bytes are not a valid record of the expected key and size."""


def _checksum(key: bytes, payload: memoryview) -> int:
    h = xxhash.xxh3_64()
    h.update(key)
    h.update(payload)
    return int(h.intdigest())


def encode_parts(key: ObjectKey, payload: memoryview) -> tuple[bytes, memoryview]:
    """(header ‖ key, payload): write both, in order, to store one record without copying."""
    kb = key.to_string().encode()
    head = HEADER.pack(MAGIC, VERSION, len(kb), payload.nbytes, _checksum(kb, payload))
    return head + kb, payload


def encode(key: ObjectKey, payload: memoryview) -> bytes:
    head, body = encode_parts(key, payload)
    return head + bytes(body)


def decode_into(key: ObjectKey, record: bytes | bytearray | memoryview, dest: memoryview) -> None:
    """Verify `record` as the value of `key` with exactly dest.nbytes bytes, then copy it in."""
    view = memoryview(record).cast("B")
    if view.nbytes < HEADER.size:
        raise RecordError(f"{key}: record of {view.nbytes} bytes is shorter than its header")
    magic, version, klen, plen, checksum = HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise RecordError(f"{key}: not a kvpool record (magic {magic!r}, version {version})")
    kb = key.to_string().encode()
    start = HEADER.size + klen
    if bytes(view[HEADER.size : start]) != kb:
        raise RecordError(f"{key}: record belongs to another key")
    if plen != dest.nbytes or view.nbytes != start + plen:
        raise RecordError(
            f"{key}: record holds {view.nbytes - start} of {plen} payload bytes, destination has {dest.nbytes}"
        )
    payload = view[start:]
    if _checksum(kb, payload) != checksum:
        raise RecordError(f"{key}: checksum mismatch")
    dest[:] = payload
