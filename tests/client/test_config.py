"""`StoreConfig`: the Store's settings as one frozen, validated value, and the two ways to use it.

`Store(master, **keywords)` keeps its Mooncake-like signature and builds a `StoreConfig` from it;
`Store.from_config` / `AsyncStore.from_config` take one. Bad values raise `InvalidParams` naming
the field, before anything connects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Any

import pytest

import kvpool
from kvpool.client import AsyncStore, Store, StoreConfig
from kvpool.errors import InvalidParams
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="16MiB")


def test_store_keywords_are_the_config_fields_with_the_same_defaults() -> None:
    params = inspect.signature(Store).parameters
    fields = {f.name: f.default for f in dataclasses.fields(StoreConfig)}
    assert list(params) == list(fields)
    for name, default in fields.items():
        given = params[name].default
        # Sizes may be given as strings ("64MiB"); the config holds their bytes.
        assert StoreConfig(**{name: given}) == StoreConfig(**{name: default}), name
    assert all(p.kind is p.KEYWORD_ONLY for name, p in params.items() if name != "master")


def test_sizes_are_converted_to_bytes_and_the_config_is_frozen() -> None:
    cfg = StoreConfig(segment_size="4GiB", arena_size="1MiB", local_buffer_size=0)
    assert (cfg.segment_size, cfg.arena_size) == (4 << 30, 1 << 20)
    assert cfg.arena_size == StoreConfig(arena_size=1 << 20).arena_size
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tenant = "other"  # type: ignore[misc]
    assert kvpool.StoreConfig is StoreConfig


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("master", "no-port"),
        ("segment_size", "4 parsecs"),
        ("segment_size", -1),
        ("arena_size", True),
        ("local_buffer_size", "lots"),
        ("tenant", ""),
        ("protocol", "rdma"),
        ("rpc_timeout", 0),
        ("transfer_timeout", -1.0),
        ("heartbeat_interval", 0),
        ("task_poll_interval", 0),
        ("failover_timeout", 0),
        ("master", "etcd://127.0.0.1/no-port"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidParams, match=field):
        StoreConfig(**{field: value})
    with pytest.raises(InvalidParams, match=field):
        Store(**{field: value})  # refused before anything connects


def test_a_store_made_from_a_config_works_and_keeps_it(one_node: Pool) -> None:
    cfg = StoreConfig(master=one_node.address, tenant="from-config", arena_size="4MiB")
    with Store.from_config(cfg) as s:
        assert s.config == cfg
        assert (s.master, s.tenant, s.protocol) == (one_node.address, "from-config", "auto")
        assert s.put("k", b"v" * 100)
        assert s.get("k") == b"v" * 100
        with Store(one_node.address) as other:  # another tenant: the key is not there
            assert not other.exists("k")
        s.remove_all(force=True)
    with Store(one_node.address, tenant="from-config", arena_size="4MiB") as s:
        assert s.config == cfg


def test_from_config_refuses_anything_else() -> None:
    with pytest.raises(InvalidParams, match="StoreConfig"):
        Store.from_config({"master": "127.0.0.1:1"})  # type: ignore[arg-type]


def test_async_store_from_config(one_node: Pool) -> None:
    cfg = StoreConfig(master=one_node.address, tenant="async-config")

    async def main() -> None:
        async with AsyncStore.from_config(cfg, workers=2) as s:
            assert s.store.config == cfg
            assert await s.put("a", b"x" * 10)
            assert await s.get("a") == b"x" * 10
            assert await s.warm_up() >= 1
            await s.remove_all(force=True)

    asyncio.run(main())


def test_verify_checksum_stays_settable_on_the_store(one_node: Pool) -> None:
    with Store(one_node.address, verify_checksum=False) as s:
        assert s.verify_checksum is False
        s.verify_checksum = True
        assert s.verify_checksum is True
        assert s.config.verify_checksum is False  # the settings it was made with


def test_async_store_has_a_coroutine_for_every_store_method() -> None:
    methods = {n for n, v in vars(Store).items() if not n.startswith("_") and callable(v)}
    for name in methods - {"from_config"}:
        coroutine = getattr(AsyncStore, name, None)
        assert inspect.iscoroutinefunction(coroutine), name
        same = inspect.signature(getattr(Store, name)).parameters
        assert list(inspect.signature(coroutine).parameters) == list(same), name


def test_an_etcd_master_gives_the_cluster_id_and_refuses_another() -> None:
    cfg = StoreConfig(master="etcd://127.0.0.1:2379,127.0.0.1:2380/pool-a")
    assert cfg.cluster_id == "pool-a"
    assert StoreConfig(master="etcd://h:1/pool-a", cluster_id="pool-a").cluster_id == "pool-a"
    with pytest.raises(InvalidParams, match="conflicts with the cluster 'pool-a'"):
        StoreConfig(master="etcd://h:1/pool-a", cluster_id="pool-b")
    assert StoreConfig(master="127.0.0.1:1", cluster_id="x").cluster_id == "x"
