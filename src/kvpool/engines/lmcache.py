"""KvpoolConnector: LMCache's remote storage on a kvpool pool, natively (docs/engines.md).

LMCache loads it as a remote storage plugin by module path; in its YAML config:

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 2
    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.engines.lmcache
      remote_storage_plugin.kvpool.class_name: KvpoolConnectorAdapter
      kvpool.master: 127.0.0.1:50051          # EngineSettings keys, under "kvpool."

(Or `remote_url: kvpool://127.0.0.1:50051` with the adapter loaded the same way, minus
`remote_storage_plugins`: the URL's host:port is then the master.)

Each LMCache chunk is one pool object under the chunk's own key string, holding the chunk's
raw KV bytes and nothing else: shapes, dtypes and format are LMCache's for the model (its
metadata), so a chunk of fewer tokens is simply a shorter object, which `reshape_partial_chunk`
turns back into a chunk. The local CPU backend's buffer is registered with the Store at
start-up, so puts and gets move each chunk with one copy between LMCache's buffer and pool
memory (`memory.PinnedRegions`), with no serialisation and no metadata header (unlike the
`mooncakestore://` route with its default `save_chunk_meta`). Layerwise storage is not
supported (the connector refuses `use_layerwise`).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvpool.engines.memory import PinnedRegions
from kvpool.engines.settings import EngineSettings
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["SCHEME", "KvpoolConnector", "KvpoolConnectorAdapter"]

log = logging.getLogger(__name__)

SCHEME = "kvpool://"
PLUGIN_TYPE = "kvpool"


def _allocator_buffers(allocator: Any) -> list[Any]:
    """The CPU tensors LMCache's local allocator hands out memory from."""
    found: dict[int, Any] = {}
    todo = [allocator]
    for _ in range(8):  # nested allocators, a few levels at most
        if not todo:
            break
        obj = todo.pop()
        for name in ("buffer", "tensor"):
            t: Any = getattr(obj, name, None)
            device = getattr(t, "device", None)
            if device is not None and device.type == "cpu" and t.numel() > 0:
                found.setdefault(int(t.data_ptr()), t)
        for name in ("pin_allocator", "allocator", "cpu_allocator"):
            sub = getattr(obj, name, None)
            if sub is not None and sub is not obj:
                todo.append(sub)
    return list(found.values())


def master_of_url(url: str) -> str | None:
    """The "host:port" of a `kvpool://host:port` URL; None for a plugin URL."""
    if url.startswith("plugin://"):
        return None
    if not url.startswith(SCHEME):
        raise InvalidParams(f"remote url {url!r}: expected {SCHEME}HOST:PORT")
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise InvalidParams(f"remote url {url!r}: expected {SCHEME}HOST:PORT")
    return f"{parts.hostname}:{parts.port}"


class KvpoolConnectorAdapter(ConnectorAdapter):  # type: ignore[misc]
    """LMCache's adapter for `kvpool://` URLs and the `kvpool` remote storage plugin."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        if url.startswith("plugin://"):
            return url[len("plugin://") :].split(".", 1)[0] == PLUGIN_TYPE
        return False

    def create_connector(self, context: ConnectorContext) -> KvpoolConnector:
        config = context.config
        extra = getattr(config, "extra_config", None) or {}
        settings = EngineSettings.from_mapping(extra, prefix="kvpool.")
        master = master_of_url(context.url)
        if master is not None:
            settings = settings.with_master(master)
        return KvpoolConnector(context.loop, context.local_cpu_backend, settings)


class KvpoolConnector(RemoteConnector):  # type: ignore[misc]
    """LMCache's `RemoteConnector` on kvpool (see the module docstring)."""

    def __init__(self, loop: Any, local_cpu_backend: Any, settings: EngineSettings) -> None:
        if local_cpu_backend is None:
            raise InvalidParams("the kvpool connector needs LMCache's local CPU backend")
        config = local_cpu_backend.config
        if getattr(config, "use_layerwise", False):
            raise InvalidParams("the kvpool connector does not support use_layerwise")
        super().__init__(config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self._settings = settings
        self._store = settings.open_store()
        self._regions = PinnedRegions(self._store)
        try:
            for buf in _allocator_buffers(local_cpu_backend.memory_allocator):
                self._regions.register(int(buf.data_ptr()), int(buf.numel()) * buf.element_size())
        except BaseException:
            self._store.close()
            raise
        log.info("kvpool connector: master %s", settings.master)

    def _key(self, key: Any) -> str:
        return f"{self._settings.key_prefix}{key.to_string()}"

    # ------------------------------------------------------------------ queries

    async def exists(self, key: Any) -> bool:
        return self.exists_sync(key)

    def exists_sync(self, key: Any) -> bool:
        return self._regions.exists([self._key(key)])[0]

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: builtins.list[Any]) -> int:
        present = self._regions.exists([self._key(k) for k in keys])
        return present.index(False) if False in present else len(present)

    async def batched_async_contains(
        self, lookup_id: str, keys: builtins.list[Any], pin: bool = False
    ) -> int:
        return await asyncio.to_thread(self.batched_contains, keys)

    async def list(self) -> builtins.list[str]:  # LMCache's name; kvpool lists no keys
        return []

    def remove_sync(self, key: Any) -> bool:
        try:
            self._store.remove(self._key(key))
        except KVPoolError:
            return False
        return True

    # ------------------------------------------------------------------ get

    async def get(self, key: Any) -> Any:
        got = await self.batched_get([key])
        return got[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: builtins.list[Any]) -> builtins.list[Any]:
        return await asyncio.to_thread(self._get_sync, keys)

    def _get_sync(self, keys: Sequence[Any]) -> builtins.list[Any]:
        objs: builtins.list[Any] = []
        for _ in keys:
            obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if obj is None:
                break
            objs.append(obj)
        if len(objs) < len(keys):
            log.warning("get: LMCache could allocate %d of %d chunks", len(objs), len(keys))
        if not objs:
            return [None] * len(keys)
        names = [self._key(k) for k in keys[: len(objs)]]
        got = self._regions.get(names, [o.data_ptr for o in objs], [o.get_size() for o in objs])
        out: builtins.list[Any] = [None] * len(keys)
        for i, (obj, n) in enumerate(zip(objs, got, strict=True)):
            if n <= 0:
                obj.ref_count_down()
                continue
            try:
                out[i] = self.reshape_partial_chunk(obj, n)
            except ValueError as exc:
                log.warning("get %s: %s", names[i], exc)
                obj.ref_count_down()
        return out

    # ------------------------------------------------------------------ put

    async def put(self, key: Any, memory_obj: Any) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: builtins.list[Any], memory_objs: builtins.list[Any]) -> None:
        await asyncio.to_thread(self._put_sync, keys, memory_objs)

    def _put_sync(self, keys: Sequence[Any], objs: Sequence[Any]) -> None:
        if len(keys) != len(objs):
            raise InvalidParams(f"{len(keys)} keys but {len(objs)} chunks")
        if not keys:
            return
        names = [self._key(k) for k in keys]
        ok = self._regions.put(names, [o.data_ptr for o in objs], [o.get_size() for o in objs])
        if not all(ok):
            log.warning("put: %d of %d chunks not stored", ok.count(False), len(ok))

    async def close(self) -> None:
        self._regions.close()
        self._store.close()
