"""Calls added in round 2: `alloc_from_mem_pool`, `get_offload_rpc_read_count`, `get_hostname`
in Mooncake's port range, and Mooncake's `etcd://h1;h2` master addresses.

Where kvpool answers as the wheel does, the test runs on both backends; `alloc_from_mem_pool`
differs on purpose (the wheel's ordinary client answers 0: only its dummy clients have a pool),
so its test runs on kvpool.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from kvpool.compat.mooncake.setup import pool_master_address
from kvpool.errors import InvalidParams


def test_get_offload_rpc_read_count_is_zero_without_an_offload_tier(backend: Any) -> None:
    store = backend.store()
    assert store.get_offload_rpc_read_count() == 0
    assert backend.new().get_offload_rpc_read_count() == 0


def test_a_pure_client_is_named_in_mooncakes_port_range(backend: Any) -> None:
    store = backend.store(segment=0)
    host, _, port = store.get_hostname().rpartition(":")
    assert host == "127.0.0.1"
    assert 12300 <= int(port) <= 14300
    other = backend.store(segment=0)
    assert other.get_hostname() != store.get_hostname()


def test_an_explicit_port_is_kept(backend: Any) -> None:
    store = backend.store(hostname="127.0.0.1:13999", segment=0)
    assert store.get_hostname() == "127.0.0.1:13999"


def _kvpool_only(backend: Any) -> None:
    if backend.name != "kvpool":
        pytest.skip("Mooncake's ordinary client answers 0: only its dummy clients have a pool")


def test_alloc_from_mem_pool_gives_registered_memory_for_the_pointer_calls(
    backend: Any,
) -> None:
    _kvpool_only(backend)
    store = backend.store()
    ptr = store.alloc_from_mem_pool(4096)
    assert ptr != 0 and ptr % 4096 == 0
    ctypes.memmove(ptr, b"x" * 4096, 4096)
    assert store.put_from("pooled", ptr, 4096) == 0
    dst = store.alloc_from_mem_pool(8192)
    assert store.get_into("pooled", dst, 8192) == 4096
    assert ctypes.string_at(dst, 4096) == b"x" * 4096
    # Already registered: registering again is the overlap Mooncake refuses.
    assert store.register_buffer(ptr, 4096) == -600


def test_alloc_from_mem_pool_is_bounded_by_the_local_buffer_and_refuses_nonsense(
    backend: Any,
) -> None:
    _kvpool_only(backend)
    store = backend.store(buffer=64 << 10)
    assert store.alloc_from_mem_pool(0) == 0
    assert store.alloc_from_mem_pool(-1) == 0
    assert store.alloc_from_mem_pool(48 << 10) != 0
    assert store.alloc_from_mem_pool(32 << 10) == 0  # 16 KiB left
    assert store.alloc_from_mem_pool(16 << 10) != 0
    assert backend.new().alloc_from_mem_pool(4096) == 0  # not set up
    with pytest.raises(TypeError):
        store.alloc_from_mem_pool("4096")
    store.close()
    assert store.alloc_from_mem_pool(4096) == 0


@pytest.mark.parametrize(
    ("mooncake", "kvpool"),
    [
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("etcd://h1:2379;h2:2379", "etcd://h1:2379,h2:2379/mooncake_cluster"),
        ("etcd://h1:2379", "etcd://h1:2379/mooncake_cluster"),
        ("etcd://h1:2379, h2:2379;", "etcd://h1:2379,h2:2379/mooncake_cluster"),
        ("etcd://h1:2379,h2:2379/prod", "etcd://h1:2379,h2:2379/prod"),
        ("redis://r:6379", "redis://r:6379"),
    ],
)
def test_mooncakes_etcd_master_addresses_become_kvpools(mooncake: str, kvpool: str) -> None:
    assert pool_master_address(mooncake) == kvpool


def test_the_cluster_id_comes_from_mc_store_cluster_id(monkeypatch: Any) -> None:
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", "c7")
    assert pool_master_address("etcd://h1:2379;h2:2379") == "etcd://h1:2379,h2:2379/c7"
    assert pool_master_address("etcd://h1:2379", "given") == "etcd://h1:2379/given"
    assert pool_master_address("etcd://h1:2379/own") == "etcd://h1:2379/own"
    with pytest.raises(InvalidParams):
        pool_master_address("etcd://;")
