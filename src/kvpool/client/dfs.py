"""The client's side of the DFS tier: writing and reading objects' files in the directory every
node and client sees (docs/parts/tiers.md, "The DFS tier"; the master's side is
`kvpool.master.dfs`).

A put that asked for `dfs_replica_num=1` gets a replica of kind DFS whose `endpoint` is the
master's `--dfs-root` and whose `offset` is the file's id; the writer writes the value to
`<root>/kvpool-dfs/<id>.tmp` and renames it to `<id>` before its PutEnd (a reader never sees a
part of a file), and removes what it wrote when the put fails. A reader reads the file with
`preadv` straight into its buffer, hashing 1 MiB pieces as they come in (the value is checked
against the checksum recorded at PutEnd, as every read). A file that is gone answers
OBJECT_NOT_FOUND: the reader tries the next replica and reports this one, which the master
drops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Final

import xxhash

from kvpool.errors import ErrorCode
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind
from kvpool.protocol.tiers import dfs_file

__all__ = ["PIECE", "read", "remove", "remove_failed", "write"]

PIECE: Final = 1 << 20
"""Bytes read and hashed at a time (as `kvpool.client.disk_files`)."""


def _path(r: ReplicaDesc) -> str | None:
    root = r.endpoint
    if not root or not os.path.isabs(root) or r.offset < 0:
        return None
    return dfs_file(root, r.offset)


def write(r: ReplicaDesc, value: memoryview) -> ErrorCode:
    """Write `value` as the file of DFS replica `r` (temporary file, then rename); OK, or
    TRANSFER_FAIL (nothing is left behind then)."""
    path = _path(r)
    if path is None:
        return ErrorCode.INVALID_REPLICA
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            done = 0
            n = value.nbytes
            while done < n:
                done += os.write(fd, value[done:])
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return ErrorCode.TRANSFER_FAIL
    return ErrorCode.OK


def remove(r: ReplicaDesc) -> None:
    """Best effort: remove the file (and a temporary one) of DFS replica `r` (its put failed)."""
    path = _path(r)
    if path is None:
        return
    for name in (path, path + ".tmp"):
        with contextlib.suppress(OSError):
            os.unlink(name)


def remove_failed(replicas: Sequence[ReplicaDesc]) -> None:
    """A failed put removes the DFS file it may have written (the master's DFS replica comes
    last in a PutStart answer)."""
    if replicas and replicas[-1].kind == ReplicaKind.DFS:
        remove(replicas[-1])


def read(r: ReplicaDesc, dest: memoryview, want_hash: bool) -> tuple[ErrorCode, int | None]:
    """Read DFS replica `r` into `dest` (its size); (code, xxh3_64 when `want_hash`).
    OBJECT_NOT_FOUND when the file is gone, TRANSFER_FAIL when it is short or unreadable."""
    path = _path(r)
    if path is None:
        return ErrorCode.INVALID_REPLICA, None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ErrorCode.OBJECT_NOT_FOUND, None
    except OSError:
        return ErrorCode.TRANSFER_FAIL, None
    hasher = xxhash.xxh3_64() if want_hash else None
    n = dest.nbytes
    pos = 0
    try:
        while pos < n:
            part = dest[pos : min(n, pos + PIECE)]
            got = os.preadv(fd, [part], pos)
            if got <= 0:
                return ErrorCode.TRANSFER_FAIL, None
            if hasher is not None:
                hasher.update(part[:got])
            pos += got
    except OSError:
        return ErrorCode.TRANSFER_FAIL, None
    finally:
        os.close(fd)
    return ErrorCode.OK, None if hasher is None else hasher.intdigest()
