"""`kvpool`: the distributed pool itself as an L2, through `kvpool.client.Store`.

    {"type": "kvpool", "master": "127.0.0.1:50051", "segment_size": "0", "key_prefix": "l2/"}

With `segment_size` > 0 this process also contributes memory to the pool (Mooncake's embedded
mode); with 0 it is a pure client. Each key is one pool object named
`<key_prefix><ObjectKey.to_string()>` in `tenant`, holding the self-checking record, so a load
is verified twice: by the pool's own checksum at read time and by the record against key and
size. Stores are upserts: keys name content, so replacing is harmless, and it repairs a value
that was ever written wrong. For the same reason reads use the Store's cached read mode by
default (`"read_mode": "cached"`: a remembered place is read without asking the master and
checked by its checksum; what that may return is in docs/parts/client.md); "strict" asks the
master on every read. A batch read that fails as a whole is retried key by key, so one
bad key costs only itself.

`kvpool.client` is imported when an adapter of this type is created, never before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.cache.adapters.threaded import Backend, Record, ThreadedAdapter
from kvpool.cache.keys import ObjectKey
from kvpool.config import parse_size
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, ObjectNotFound

__all__ = ["PoolAdapterConfig", "PoolBackend", "create_pool_adapter"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolAdapterConfig(AdapterConfig):
    master: str = "127.0.0.1:50051"
    """HOST:PORT of the pool's master."""
    segment_size: int | str = 0
    """Bytes of this process's memory to contribute to the pool (0: client only)."""
    tenant: str = "default"
    key_prefix: str = "l2/"
    """Prefix of every pool key this adapter writes."""
    protocol: str = "auto"
    """Transfer protocol: auto (shm on this host, TCP otherwise), shm or tcp."""
    workers: int = 4
    read_mode: str = "cached"
    """The Store's read mode: "cached" (keys are content hashes) or "strict"."""

    def __post_init__(self) -> None:
        if self.read_mode not in ("cached", "strict"):
            raise InvalidParams(
                f"kvpool.read_mode must be cached or strict, got {self.read_mode!r}"
            )
        if not isinstance(self.master, str) or ":" not in self.master:
            raise InvalidParams(f'kvpool adapter needs "master" as HOST:PORT, got {self.master!r}')
        object.__setattr__(
            self, "segment_size", parse_size(self.segment_size, name="kvpool.segment_size")
        )
        if self.protocol not in ("auto", "shm", "tcp"):
            raise InvalidParams(f"kvpool.protocol must be auto, shm or tcp, got {self.protocol!r}")


class PoolBackend(Backend):
    def __init__(self, config: PoolAdapterConfig) -> None:
        from kvpool.client import Store

        self._prefix = config.key_prefix
        self._store: Any = Store(
            config.master,
            segment_size=config.segment_size,
            tenant=config.tenant,
            protocol=config.protocol,
            read_mode=config.read_mode,
        )

    def _name(self, key: ObjectKey) -> str:
        return self._prefix + key.to_string()

    def put_many(self, items: Sequence[tuple[ObjectKey, Record]]) -> None:
        latest: dict[str, bytes] = {}
        for key, (head, payload) in items:  # the Store refuses duplicate keys in one batch
            latest[self._name(key)] = b"".join((head, payload))
        names = list(latest)
        codes = self._store.batch_upsert(names, [latest[n] for n in names])
        bad = [(n, c) for n, c in zip(names, codes, strict=True) if c != ErrorCode.OK]
        if bad:
            name, code = bad[0]
            raise KVPoolError(
                f"{len(bad)} of {len(names)} upserts failed; first {name!r}: {ErrorCode.of(code).name}",
                ErrorCode.of(code),
            )

    def get_many(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        names = [self._name(k) for k in keys]
        try:
            values = self._store.batch_get(names)
        except KVPoolError as exc:
            logger.info("kvpool batch read failed (%s); retrying key by key", exc)
            values = [self._get_one(n) for n in names]
        return [bytes(v) if v is not None else None for v in values]

    def _get_one(self, name: str) -> bytearray | None:
        try:
            value: bytearray = self._store.get(name)
            return value
        except ObjectNotFound:
            return None
        except KVPoolError as exc:
            logger.warning("kvpool read of %s failed: %s", name, exc)
            return None

    def exists_many(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return [bool(x) for x in self._store.batch_exists([self._name(k) for k in keys])]

    def delete_many(self, keys: Sequence[ObjectKey]) -> None:
        # force: a reader's lease (every read grants one) must not keep a deleted chunk alive
        # and full; this adapter's own lookup locks already keep its loads safe, and a reader
        # in another process only gets a per-key load failure, never wrong bytes.
        if keys:
            self._store.batch_remove([self._name(k) for k in keys], force=True)

    def close(self) -> None:
        self._store.close()


def create_pool_adapter(config: PoolAdapterConfig) -> ThreadedAdapter:
    return ThreadedAdapter(PoolBackend(config), name="kvpool", workers=config.workers)


register_adapter("kvpool", PoolAdapterConfig, create_pool_adapter)
