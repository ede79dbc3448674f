"""`fs`: one file per key under a base directory, written atomically.

Layout: `<base>/<model>/<kv_rank:08x>@<group:x>@<hash hex>[@<salt>].kvp`, where model and salt
are percent-encoded (so "/" or ".." in a model name never leaves its directory, and any name
survives) and a component longer than 200 bytes is shortened to a prefix plus a 128-bit hash of
the whole (file names have a 255-byte limit). Shortening can in principle collide; the record
inside every file carries the full key, so a collision reads as a miss, never as wrong bytes.

Writes go to `<base>/.tmp/<pid>-<random>.tmp` (same filesystem) and are published with
`os.replace`, so a reader sees the whole old file, the whole new file or nothing: no partial
file is ever visible, also when the writer crashes. A temp file is unlinked by its writer on any
error; those left by a crashed process (its pid is gone) are removed when an adapter opens the
directory.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psutil
import xxhash

from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.cache.adapters.threaded import Backend, Record, ThreadedAdapter
from kvpool.cache.keys import ObjectKey
from kvpool.errors import InvalidParams

__all__ = ["FsAdapterConfig", "FsBackend", "create_fs_adapter", "key_path"]

logger = logging.getLogger(__name__)

_MAX_COMPONENT = 200
_SAFE = "-._~"


@dataclass(frozen=True)
class FsAdapterConfig(AdapterConfig):
    base_path: str = ""
    """Directory that holds the files (created if missing)."""
    workers: int = 4
    """Worker threads doing file I/O."""
    fsync: bool = False
    """fsync each file before publishing it (durable across power loss; slower)."""

    def __post_init__(self) -> None:
        if not isinstance(self.base_path, str) or not self.base_path:
            raise InvalidParams(f'fs adapter needs "base_path", got {self.base_path!r}')
        if not isinstance(self.fsync, bool):
            raise InvalidParams(f"fs.fsync must be true or false, got {self.fsync!r}")


def _component(text: str) -> str:
    enc = quote(text, safe=_SAFE)
    if enc in (".", ".."):  # "." is left alone by quote(); as a directory name it would escape
        enc = "%2E" * len(enc)
    if len(enc) <= _MAX_COMPONENT:
        return enc
    return enc[:80] + "~" + xxhash.xxh3_128_hexdigest(text.encode())


def key_path(base: Path, key: ObjectKey) -> Path:
    """Where the record of `key` lives under `base`."""
    name = f"{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}"
    if key.cache_salt:
        name += "@" + quote(key.cache_salt, safe=_SAFE)
    if len(name) > _MAX_COMPONENT:
        name = name[:80] + "~" + xxhash.xxh3_128_hexdigest(name.encode())
    return base / _component(key.model_name) / (name + ".kvp")


class FsBackend(Backend):
    def __init__(self, base_path: str, *, fsync: bool = False) -> None:
        self._base = Path(base_path)
        self._tmp = self._base / ".tmp"
        self._fsync = fsync
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temp_files()

    @property
    def base(self) -> Path:
        return self._base

    def _remove_stale_temp_files(self) -> None:
        for entry in self._tmp.iterdir():
            pid_text = entry.name.split("-", 1)[0]
            if pid_text.isdigit() and not psutil.pid_exists(int(pid_text)):
                logger.info("removing %s left by a dead writer", entry)
                entry.unlink(missing_ok=True)

    def path(self, key: ObjectKey) -> Path:
        return key_path(self._base, key)

    def _write_one(self, key: ObjectKey, record: Record) -> None:
        final = self.path(key)
        tmp = self._tmp / f"{os.getpid()}-{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        published = False
        try:
            try:
                for part in record:
                    view = memoryview(part).cast("B")
                    while view.nbytes:  # bounded: each write makes progress or raises
                        n = os.write(fd, view)
                        view = view[n:]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            published = True
        finally:
            if not published:
                tmp.unlink(missing_ok=True)

    def put_many(self, items: Sequence[tuple[ObjectKey, Record]]) -> None:
        for key, record in items:
            self._write_one(key, record)

    def get_many(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key in keys:
            try:
                with open(self.path(key), "rb", buffering=0) as f:
                    out.append(f.read())
            except FileNotFoundError:
                out.append(None)
        return out

    def exists_many(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return [self.path(k).is_file() for k in keys]

    def delete_many(self, keys: Sequence[ObjectKey]) -> None:
        for key in keys:
            self.path(key).unlink(missing_ok=True)

    def close(self) -> None:
        pass  # no handle outlives a call


def create_fs_adapter(config: FsAdapterConfig) -> ThreadedAdapter:
    return ThreadedAdapter(
        FsBackend(config.base_path, fsync=config.fsync), name="fs", workers=config.workers
    )


register_adapter("fs", FsAdapterConfig, create_fs_adapter)
