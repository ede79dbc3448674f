"""vLLM's in-tree Mooncake store connector, its call sequences replayed on both backends.

vllm/distributed/mooncake_store.py and
vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py (vLLM 0.33) drive
`MooncakeDistributedStore` like this, and these tests make exactly those calls, with CPU memory
standing in for the KV cache tensors:

* `setup(local_hostname, metadata_server, segment, buffer, protocol, device_name, master,
  tenant_id=T)`, `tenant_id` passed only when it is not "default"; a non-zero answer aborts;
* a `ReplicateConfig()` kept per worker, its `group_ids` set to one id per key before a put
  when group semantics are on (`hasattr(ReplicateConfig, "group_ids")` decides);
* `register_buffer(base, nbytes)` once per KV cache storage (0 expected, else it raises);
* save: `batch_is_exist(keys)`, then `batch_put_from_multi_buffers` of the keys whose answer
  is not 1, one address per layer per key; a value < 0 is a failed key;
* load: `batch_get_into_multi_buffers(keys, addrs, sizes)`, a value < 0 a failed key;
* tier logging: `batch_get_replica_desc(keys)` → `descs[key][0].is_memory_replica()`;
* reset: `remove_all(force=True)`; then `close()`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

LAYERS = 3
BLOCKS = 8
BLOCK_BYTES = 4096
TENANT = "vllm-tenant"


class _Worker:
    """One vLLM worker's store, with a registered KV cache of LAYERS x BLOCKS blocks."""

    def __init__(self, backend: Any, tenant: str, segment: int = 16 << 20) -> None:
        self.store = backend.new()
        kwargs = {"tenant_id": tenant} if tenant != "default" else {}
        args = backend.setup_args(segment=segment)
        assert self.store.setup(*args, **kwargs) == 0
        self.cfg = backend.module.ReplicateConfig()
        self.kv = [np.zeros(BLOCKS * BLOCK_BYTES, dtype=np.uint8) for _ in range(LAYERS)]
        for layer in self.kv:
            assert self.store.register_buffer(layer.ctypes.data, layer.nbytes) == 0

    def addrs(self, blocks: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        ptrs = [[layer.ctypes.data + b * BLOCK_BYTES for layer in self.kv] for b in blocks]
        return ptrs, [[BLOCK_BYTES] * LAYERS for _ in blocks]

    def save(self, keys: list[str], blocks: list[int], groups: bool = True) -> list[int]:
        exists = self.store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists) if e != 1]
        if not missing:
            return []
        keys = [keys[i] for i in missing]
        ptrs, sizes = self.addrs([blocks[i] for i in missing])
        if groups and hasattr(type(self.cfg), "group_ids"):
            self.cfg.group_ids = [f"vllm-mooncake-store:model@{k.rsplit('@', 1)[-1]}" for k in keys]
        res = self.store.batch_put_from_multi_buffers(keys, ptrs, sizes, self.cfg)
        return list(res)

    def load(self, keys: list[str], blocks: list[int]) -> list[int]:
        ptrs, sizes = self.addrs(blocks)
        return list(self.store.batch_get_into_multi_buffers(keys, ptrs, sizes))


def _keys(n: int, prefix: str = "model@tp_rank:0") -> list[str]:
    return [f"{prefix}@{i:064x}" for i in range(n)]


def _fill(worker: _Worker, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for layer in worker.kv:
        layer[:] = rng.integers(0, 256, layer.nbytes, dtype=np.uint8)


def test_save_then_load_in_another_worker_is_bit_exact(backend: Any) -> None:
    producer, consumer = _Worker(backend, TENANT), _Worker(backend, TENANT, segment=0)
    _fill(producer, 1)
    keys = _keys(4, "save-load")
    assert producer.save(keys, [0, 2, 4, 6]) == [0, 0, 0, 0]
    assert producer.save(keys, [0, 2, 4, 6]) == []  # every key exists: nothing is put
    assert consumer.store.batch_is_exist(keys) == [1, 1, 1, 1]
    assert consumer.load(keys, [7, 6, 5, 4]) == [LAYERS * BLOCK_BYTES] * 4
    for src, dst in zip([0, 2, 4, 6], [7, 6, 5, 4], strict=True):
        for p_layer, c_layer in zip(producer.kv, consumer.kv, strict=True):
            got = c_layer[dst * BLOCK_BYTES : (dst + 1) * BLOCK_BYTES]
            assert np.array_equal(got, p_layer[src * BLOCK_BYTES : (src + 1) * BLOCK_BYTES])


def test_a_missing_key_fails_only_its_own_load(backend: Any) -> None:
    producer = _Worker(backend, TENANT)
    _fill(producer, 2)
    keys = _keys(2, "partial")
    assert producer.save(keys[:1], [1]) == [0]
    res = producer.load(keys, [3, 4])
    assert res[0] == LAYERS * BLOCK_BYTES and res[1] < 0


def test_tier_logging_sees_memory_replicas(backend: Any) -> None:
    producer = _Worker(backend, TENANT)
    _fill(producer, 3)
    keys = _keys(2, "tier")
    assert producer.save(keys, [0, 1]) == [0, 0]
    descs = producer.store.batch_get_replica_desc(keys)
    assert hasattr(descs, "get")
    for key in keys:
        replicas = descs.get(key)
        assert replicas and replicas[0].is_memory_replica()


def test_remove_all_force_resets_the_store(backend: Any) -> None:
    producer = _Worker(backend, TENANT)
    _fill(producer, 4)
    keys = _keys(3, "reset")
    assert producer.save(keys, [0, 1, 2]) == [0, 0, 0]
    assert producer.load(keys, [3, 4, 5]) == [LAYERS * BLOCK_BYTES] * 3  # leases them
    assert producer.store.remove_all(force=True) >= 3
    assert producer.store.batch_is_exist(keys) == [0, 0, 0]
    assert all(r < 0 for r in producer.load(keys, [3, 4, 5]))
    assert producer.save(keys, [0, 1, 2]) == [0, 0, 0]  # and it takes puts again


def test_without_group_semantics_the_config_is_used_as_is(backend: Any) -> None:
    producer = _Worker(backend, TENANT)
    _fill(producer, 5)
    keys = _keys(2, "nogroup")
    assert producer.save(keys, [0, 1], groups=False) == [0, 0]
    assert producer.load(keys, [2, 3]) == [LAYERS * BLOCK_BYTES] * 2


@pytest.mark.parametrize("tenant", ["default", TENANT])
def test_setup_takes_tenant_id_as_vllm_passes_it(backend: Any, tenant: str) -> None:
    worker = _Worker(backend, tenant)
    assert worker.store.health_check() == 0
    assert worker.store.close() == 0
