"""Who uses the cached read mode: the L2 pool adapter by default (its keys are content
hashes), the Mooncake-compatible store when `MC_STORE_READ_MODE=cached` says so."""

from __future__ import annotations

import pytest

from kvpool.cache.adapters.pool import PoolAdapterConfig, PoolBackend
from kvpool.compat.mooncake.store import MooncakeDistributedStore
from kvpool.errors import InvalidParams
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


def test_the_l2_pool_adapter_reads_in_cached_mode_unless_told_otherwise(one_node: Pool) -> None:
    with pytest.raises(InvalidParams, match="read_mode"):
        PoolAdapterConfig(master=one_node.address, read_mode="sometimes")
    cached = PoolBackend(PoolAdapterConfig(master=one_node.address, key_prefix="c/"))
    strict = PoolBackend(
        PoolAdapterConfig(master=one_node.address, key_prefix="s/", read_mode="strict")
    )
    try:
        assert cached._store.config.read_mode == "cached"
        assert strict._store.config.read_mode == "strict"
        cached._store.put("c/k", b"v" * 100)
        assert cached._store.get("c/k") == b"v" * 100
        assert len(cached._store._locations) == 1
    finally:
        cached._store.remove_all(force=True)
        cached.close()
        strict.close()


@pytest.mark.parametrize(("env", "mode"), [(None, "strict"), ("cached", "cached"), ("x", "strict")])
def test_the_mooncake_store_opts_in_by_config(
    one_node: Pool, monkeypatch: pytest.MonkeyPatch, env: str | None, mode: str
) -> None:
    if env is None:
        monkeypatch.delenv("MC_STORE_READ_MODE", raising=False)
    else:
        monkeypatch.setenv("MC_STORE_READ_MODE", env)
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", one_node.address) == 0
    try:
        assert store._store is not None and store._store.config.read_mode == mode
    finally:
        store.close()


@pytest.mark.parametrize(
    ("mode", "size", "want"),
    [("cached", "4MB", 4 << 20), ("strict", "4MB", 0), ("cached", "lots", 0), ("cached", None, 0)],
)
def test_the_mooncake_hot_cache_size_applies_in_cached_mode_only(
    one_node: Pool, monkeypatch: pytest.MonkeyPatch, mode: str, size: str | None, want: int
) -> None:
    monkeypatch.setenv("MC_STORE_READ_MODE", mode)
    if size is None:
        monkeypatch.delenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", raising=False)
    else:
        monkeypatch.setenv("MC_STORE_LOCAL_HOT_CACHE_SIZE", size)
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", one_node.address) == 0
    try:
        assert store._store is not None and store._store.config.hot_cache_size == want
        assert (store._store.hot_cache is not None) == (want > 0)
    finally:
        store.close()
