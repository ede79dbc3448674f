"""KvpoolHiCacheStorage: SGLang's HiCache L3 storage on a kvpool pool, natively.

SGLang loads it by module path (docs/engines.md has the full command):

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
            "module_path": "kvpool.engines.sglang", "class_name": "KvpoolHiCacheStorage",
            "interface_v1": 1, "master": "127.0.0.1:50051"}'

`interface_v1: 1` makes SGLang's cache controller call the zero-copy `batch_get_v1` /
`batch_set_v1`; without it SGLang uses the older `batch_get` / `batch_set` of whole flat pages,
which this backend serves too. The other keys of the JSON are kvpool's (`EngineSettings`:
master, tenant, protocol, segment_size, token, key_prefix).

Layout. A page is what `mem_pool_host.get_page_buffer_meta(indices)` says it is: one or more
contiguous pieces of the host pool (K and V of a page for an MHA pool in page_first layout,
one piece per layer and K/V in layer_first, one for MLA). Piece `j` of page `key` is the pool
object `{key_prefix}{key}_{rank}_{j}`, where `rank` is `{tp_rank}_{pp_rank}` for MHA (each TP
rank holds its own heads) and `{pp_rank}` for MLA (every TP rank holds the same latent cache,
and SGLang's cache controller lets only the storage writer rank back pages up). The host pool's buffers are registered with the Store
when SGLang registers the pool, so every piece moves with one copy between the host pool and
pool memory (`memory.PinnedRegions`). A flat page of the older interface is one object,
`{key_prefix}{key}_{rank}_flat`.

Not covered: the v2 interface (hybrid models with extra pools: Mamba, SWA, DSA) and head
splitting across different TP sizes (`tp_lcm_size`); SGLang falls back to its v1 path for the
models these do not concern.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from kvpool.engines.memory import PinnedRegions
from kvpool.engines.settings import EngineSettings
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["KvpoolHiCacheStorage"]

log = logging.getLogger(__name__)


def _host_buffers(pool: Any) -> list[Any]:
    """The tensors of a host pool that its pages point into."""
    get = getattr(pool, "get_hybrid_pool_buffer", None)
    if get is not None:
        return [b for b in get() if b is not None]
    named = [getattr(pool, n, None) for n in ("kv_buffer", "k_buffer", "v_buffer")]
    return [b for b in named if isinstance(b, torch.Tensor)]


class KvpoolHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang's `HiCacheStorage` on a kvpool pool (see the module docstring)."""

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        extra = getattr(storage_config, "extra_config", None) or {}
        self._settings = EngineSettings.from_mapping(extra)
        self.storage_config = storage_config
        self._mla = bool(storage_config.is_mla_model)
        pp_rank = int(storage_config.pp_rank)
        self._rank = f"{pp_rank}" if self._mla else f"{int(storage_config.tp_rank)}_{pp_rank}"
        self._store = self._settings.open_store()
        self._regions = PinnedRegions(self._store)
        self._parts_per_page = 0
        self._page_size = 1
        self.mem_pool_host: Any = None
        log.info(
            "kvpool HiCache storage: master %s, rank suffix %s", self._settings.master, self._rank
        )

    # ------------------------------------------------------------------ set-up

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Remember the host pool and register its buffers for zero-copy I/O."""
        super().register_mem_pool_host(mem_pool_host)
        self._page_size = int(mem_pool_host.page_size)
        for buf in _host_buffers(mem_pool_host):
            nbytes = int(buf.numel()) * int(buf.element_size())
            if nbytes > 0 and buf.device.type == "cpu":
                self._regions.register(int(buf.data_ptr()), nbytes)
        if hasattr(mem_pool_host, "get_page_buffer_meta"):
            ptrs, _ = mem_pool_host.get_page_buffer_meta(torch.arange(self._page_size))
            self._parts_per_page = len(ptrs)

    def close(self) -> None:
        """Unregister the host pool's memory and close the Store."""
        self._regions.close()
        self._store.close()

    def clear(self) -> None:
        """Remove every object of this tenant (SGLang's `/clear_hicache_storage_backend`)."""
        try:
            self._store.remove_all()
        except KVPoolError as exc:
            log.warning("clear: %s", exc)

    # ------------------------------------------------------------------ keys

    def _page_keys(self, keys: Sequence[str], parts: int) -> list[str]:
        p = self._settings.key_prefix
        return [f"{p}{k}_{self._rank}_{j}" for k in keys for j in range(parts)]

    def _flat_key(self, key: str) -> str:
        return f"{self._settings.key_prefix}{key}_{self._rank}_flat"

    def _pieces(
        self, keys: Sequence[str], host_indices: Any
    ) -> tuple[list[str], list[int], list[int]]:
        if self.mem_pool_host is None:
            raise InvalidParams("no host pool registered (register_mem_pool_host)")
        if len(host_indices) != len(keys) * self._page_size:
            raise InvalidParams(
                f"{len(keys)} keys but {len(host_indices)} host indices "
                f"(page size {self._page_size})"
            )
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys):
            raise InvalidParams(f"{len(ptrs)} page pieces for {len(keys)} keys")
        parts = len(ptrs) // len(keys)
        return self._page_keys(keys, parts), [int(a) for a in ptrs], [int(n) for n in sizes]

    @staticmethod
    def _per_page(ok: Sequence[bool], pages: int) -> list[bool]:
        if pages == 0:
            return []
        parts = len(ok) // pages
        return [all(ok[i * parts : (i + 1) * parts]) for i in range(pages)]

    # ------------------------------------------------------------------ v1 (zero-copy)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Store each page of the host pool under its key; per page whether it is stored."""
        if not keys:
            return []
        names, ptrs, sizes = self._pieces(keys, host_indices)
        return self._per_page(self._regions.put(names, ptrs, sizes), len(keys))

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read each page into the host pool; per page whether every piece arrived whole."""
        if not keys:
            return []
        names, ptrs, sizes = self._pieces(keys, host_indices)
        got = self._regions.get(names, ptrs, sizes)
        ok = [n == size for n, size in zip(got, sizes, strict=True)]
        return self._per_page(ok, len(keys))

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many pages from the start of `keys` the pool holds whole."""
        if not keys:
            return 0
        parts = self._parts_per_page or 1
        present = self._regions.exists(self._page_keys(keys, parts))
        for i in range(len(keys)):
            if not all(present[i * parts : (i + 1) * parts]):
                return i
        return len(keys)

    def exists(self, key: str) -> bool:
        """Whether the pool holds page `key` (any interface)."""
        if self.batch_exists([key]) == 1:
            return True
        return self._regions.exists([self._flat_key(key)])[0]

    # ------------------------------------------------------------------ flat pages

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store one flat page: a tensor (`value`), or `target_sizes` bytes at the address
        `target_location`."""
        return self.batch_set(
            [key],
            None if value is None else [value],
            None if target_location is None else [target_location],
            None if target_sizes is None else [target_sizes],
        )

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store flat pages (tensors, or addresses and sizes); True when all are stored."""
        if not keys:
            return True
        addrs, sizes = self._locations(keys, values, target_locations, target_sizes)
        names = [self._flat_key(k) for k in keys]
        return all(self._regions.put(names, addrs, sizes))

    def get(
        self,
        key: str,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> torch.Tensor | None:
        """Read one flat page into `target_location` (a tensor, or an address with
        `target_sizes` bytes); the tensor read into, None when the page is missing."""
        got = self.batch_get(
            [key],
            None if target_location is None else [target_location],
            None if target_sizes is None else [target_sizes],
        )
        return got[0] if isinstance(got, list) else None

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> list[torch.Tensor | None]:
        """Read flat pages into their targets (tensors, or addresses and sizes); per key the
        target (a tensor when one was given, else True), None when missing or short."""
        if not keys:
            return []
        if target_locations is None:
            raise InvalidParams("batch_get needs target_locations (SGLang passes dummy pages)")
        addrs, sizes = self._locations(keys, target_locations, None, target_sizes)
        got = self._regions.get([self._flat_key(k) for k in keys], addrs, sizes)
        out: list[Any] = []
        for i, n in enumerate(got):
            target = target_locations[i]
            if n != sizes[i]:
                out.append(None)
            else:
                out.append(target if isinstance(target, torch.Tensor) else True)
        return out

    @staticmethod
    def _locations(
        keys: Sequence[str], tensors: Any, addrs: Any, sizes: Any
    ) -> tuple[list[int], list[int]]:
        if tensors is not None:
            if len(tensors) != len(keys):
                raise InvalidParams(f"{len(keys)} keys but {len(tensors)} values")
            out_addrs, out_sizes = [], []
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    if t.device.type != "cpu" or not t.is_contiguous():
                        raise InvalidParams("flat pages must be contiguous CPU tensors")
                    out_addrs.append(int(t.data_ptr()))
                    out_sizes.append(int(t.numel()) * int(t.element_size()))
                else:
                    out_addrs.append(int(t))
                    out_sizes.append(-1)
            if sizes is not None:
                out_sizes = [int(s) for s in sizes]
            if any(s <= 0 for s in out_sizes):
                raise InvalidParams("an address without its size")
            return out_addrs, out_sizes
        if addrs is None or sizes is None:
            raise InvalidParams("set needs a value, or target_location and target_sizes")
        if not len(addrs) == len(sizes) == len(keys):
            raise InvalidParams(f"{len(keys)} keys, {len(addrs)} locations, {len(sizes)} sizes")
        return [int(a) for a in addrs], [int(s) for s in sizes]
