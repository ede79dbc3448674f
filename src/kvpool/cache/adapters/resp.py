"""`resp`: Redis (or any RESP server: Valkey, KeyDB) through redis-py with hiredis.

    {"type": "resp", "host": "127.0.0.1", "port": 6379, "key_prefix": "kvpool:l2:"}

One record per key under `<key_prefix><ObjectKey.to_string()>`; a batch is one pipeline (no
transaction: keys are independent), a load is one MGET, a lookup one pipeline of EXISTS.
SET replaces a value atomically, so readers never see a partial record. The connection pool
is shared by the adapter's worker threads and sized to them; every call has a socket timeout
so that `close()` never waits on a dead server for longer than that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.cache.adapters.threaded import Backend, Record, ThreadedAdapter
from kvpool.cache.keys import ObjectKey
from kvpool.errors import InvalidParams

__all__ = ["RespAdapterConfig", "RespBackend", "create_resp_adapter"]


@dataclass(frozen=True)
class RespAdapterConfig(AdapterConfig):
    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    key_prefix: str = "kvpool:l2:"
    """Prefix of every Redis key this adapter writes (lets deployments share a server)."""
    workers: int = 4
    socket_timeout_s: float = 10.0
    """Seconds any one Redis call may take before it fails its task."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise InvalidParams(f"resp.host must be a non-empty str, got {self.host!r}")
        if (
            isinstance(self.port, bool)
            or not isinstance(self.port, int)
            or not 0 < self.port < 65536
        ):
            raise InvalidParams(f"resp.port must be in 1..65535, got {self.port!r}")
        if not isinstance(self.socket_timeout_s, int | float) or self.socket_timeout_s <= 0:
            raise InvalidParams(f"resp.socket_timeout_s must be > 0, got {self.socket_timeout_s!r}")


class RespBackend(Backend):
    def __init__(self, config: RespAdapterConfig) -> None:
        import redis

        self._prefix = config.key_prefix
        self._pool = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
            host=config.host,
            port=config.port,
            db=config.db,
            username=config.username,
            password=config.password,
            max_connections=config.workers + 1,
            timeout=config.socket_timeout_s,
            socket_timeout=config.socket_timeout_s,
            socket_connect_timeout=config.socket_timeout_s,
        )
        self._redis = redis.Redis(connection_pool=self._pool)

    def _name(self, key: ObjectKey) -> str:
        return self._prefix + key.to_string()

    def put_many(self, items: Sequence[tuple[ObjectKey, Record]]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for key, (head, payload) in items:
            pipe.set(self._name(key), b"".join((head, payload)))
        pipe.execute()

    def get_many(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        if not keys:
            return []
        values = self._redis.mget([self._name(k) for k in keys])
        return [v if isinstance(v, bytes) else None for v in values]

    def exists_many(self, keys: Sequence[ObjectKey]) -> list[bool]:
        pipe = self._redis.pipeline(transaction=False)
        for k in keys:
            pipe.exists(self._name(k))
        return [bool(n) for n in pipe.execute()]

    def delete_many(self, keys: Sequence[ObjectKey]) -> None:
        if keys:
            self._redis.delete(*[self._name(k) for k in keys])

    def close(self) -> None:
        self._redis.close()
        self._pool.disconnect()


def create_resp_adapter(config: RespAdapterConfig) -> ThreadedAdapter:
    return ThreadedAdapter(RespBackend(config), name="resp", workers=config.workers)


register_adapter("resp", RespAdapterConfig, create_resp_adapter)
