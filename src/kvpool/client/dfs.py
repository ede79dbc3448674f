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

The DFS directory may be mounted at another path here than on the master (`Store(dfs_root=)`,
`kvpool node --dfs-root`): a Store given one `attach`es it, and while any Store of the process
holds it the DFS files of that directory's master are read, written and removed under this
path instead of the replica's `endpoint`. It is one path per process (a mount point is a fact
of the host, not of a Store): a second Store naming another one is refused. Only the replicas
of the master whose directory it is are translated (`_root`): those whose `endpoint` is the
root the master wrote into the directory (`DFS_ROOT_FILE`, `kvpool.master.dfs`), or a path of
the same directory here; the replicas of any other pool the process talks to keep their own
`endpoint`.

Batch puts that ask for a DFS copy (`batch_put(..., ReplicateConfig(dfs_replica_num=1))`) take
the batched path (one BatchPutStart): each started key's file is written before the batch's
memory writes (`kvpool.client.writer.batches`). Upserts write the file of the new value, arena
puts that ask for a copy take PutStart (`kvpool.client.writer.base._arena_config`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Sequence
from typing import Final

import xxhash

from kvpool.errors import (
    ErrorCode,
    InvalidParams,
)
from kvpool.protocol.messages import ReplicaDesc, ReplicaKind
from kvpool.protocol.tiers import DFS_ROOT_FILE, dfs_file

__all__ = [
    "PIECE",
    "Attachment",
    "attach",
    "check_root",
    "detach",
    "local_root",
    "read",
    "remove",
    "remove_failed",
    "write",
]

PIECE: Final = 1 << 20
"""Bytes read and hashed at a time (as `kvpool.client.disk_files`)."""


_ROOT_FILE_MAX: Final = 1 << 16
"""Characters read of `DFS_ROOT_FILE` at most (a path)."""

_lock = threading.Lock()
_local: list[str | None] = [None]
"""The DFS directory's path in this process (None: the master's, each replica's endpoint)."""
_users: list[int] = [0]
_roots: dict[str, str] = {}
"""Replica endpoints (master roots) decided while `_local[0]` is held: the path used for each."""
_fsyncs: list[int] = [0]
"""Open Stores that asked for `fsync` of each DFS file before its rename."""


@dataclasses.dataclass(frozen=True, slots=True)
class Attachment:
    """What one Store (or node) asked of this process's DFS files, until its `detach`."""

    root: str | None
    fsync: bool


def check_root(root: object) -> str:
    """`root` as an absolute path of an existing directory; InvalidParams otherwise."""
    if not isinstance(root, str) or not root or "\0" in root:
        raise InvalidParams(f"dfs_root: expected a directory path, got {root!r:.200}")
    path = os.path.abspath(root)
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        raise InvalidParams(f"dfs_root {root!r:.200} {what}")
    return path


def attach(root: str | None, *, fsync: bool = False) -> Attachment:
    """From now on until `detach`: DFS files are read and written under `root` (validated,
    made absolute; None: at the master's path), and `fsync`ed before their rename when
    `fsync` (on while any open Store asked for it). InvalidParams when another Store of the
    process sees the directory at another path."""
    path = None if root is None else check_root(root)
    with _lock:
        if path is not None:
            if _users[0] and _local[0] != path:
                raise InvalidParams(
                    f"dfs_root {path!r:.200}: this process already sees the DFS directory "
                    f"at {_local[0]!r:.200} (one path per process)"
                )
            if _local[0] != path:
                _roots.clear()
            _local[0] = path
            _users[0] += 1
        if fsync:
            _fsyncs[0] += 1
    return Attachment(path, fsync)


def detach(a: Attachment) -> None:
    """The Store that made `a` is closed: the master's paths are used again when it was the
    last one to name a path, and files are no longer synced when it was the last to ask."""
    with _lock:
        if a.root is not None and _users[0] and _local[0] == a.root:
            _users[0] -= 1
            if not _users[0]:
                _local[0] = None
                _roots.clear()
        if a.fsync and _fsyncs[0]:
            _fsyncs[0] -= 1


def local_root() -> str | None:
    """The DFS directory's path in this process, when a Store named one."""
    return _local[0]


def _root(endpoint: str) -> str:
    """Where the files of replicas with `endpoint` (their master's root) are here: this
    process's path when it is that master's directory (module docstring), else `endpoint`."""
    local = _local[0]
    if local is None or endpoint == local:
        return endpoint
    known = _roots.get(endpoint)
    if known is not None:
        return known
    try:
        with open(os.path.join(local, DFS_ROOT_FILE), encoding="utf-8") as f:
            named = f.read(_ROOT_FILE_MAX).splitlines()
    except (OSError, ValueError):
        named = []
    if endpoint in named:
        where = local
    else:
        try:
            where = local if os.path.samefile(endpoint, local) else endpoint
        except OSError:  # not here (or not now): decided again next time
            return endpoint
    with _lock:
        if _local[0] == local:
            _roots[endpoint] = where
    return where


def _path(r: ReplicaDesc) -> str | None:
    root = _root(r.endpoint)
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
            if _fsyncs[0]:  # durable before it is named (costs: docs/parts/perf-tiers.md)
                os.fdatasync(fd)
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


def split(
    replicas: Sequence[ReplicaDesc],
) -> tuple[ReplicaDesc | None, Sequence[ReplicaDesc]]:
    """The DFS replica of a put's answer (found by kind: a fresh put lists it last, but an
    in-place upsert answers the stored order, where a promotion from DFS put the memory copy
    after it) and the other replicas in their order; (None, `replicas`) without one."""
    for i, r in enumerate(replicas):
        if r.kind is ReplicaKind.DFS:
            return r, [*replicas[:i], *replicas[i + 1 :]]
    return None, replicas


def remove_failed(replicas: Sequence[ReplicaDesc]) -> None:
    """A failed put removes the DFS file it may have written (its DFS replica, wherever the
    answer lists it)."""
    for r in replicas:
        if r.kind is ReplicaKind.DFS:
            remove(r)


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
