"""Two stores in one process, each contributing a segment (Mooncake's replicated-store test).

With replica_num=2 every object has a replica in each segment, so closing one store (which
unmounts its segment and drops the replicas in it) must leave every object readable through the
other. With replicas on one segment only, about half the keys would be lost, so a placement that
ignores replica_num fails this test.
"""

from __future__ import annotations

from typing import Any

import pytest

N = 24


def test_replicas_on_two_segments_survive_closing_one(backend: Any) -> None:
    first = backend.store()
    second = backend.store()
    assert first.get_hostname() != second.get_hostname()
    cfg = backend.module.ReplicateConfig()
    cfg.replica_num = 2
    keys = [f"rep-{i}" for i in range(N)]
    values = [f"value {i} ".encode() * (i + 1) for i in range(N)]
    assert first.put_batch(keys, values, cfg) == 0
    assert second.get_batch(keys) == values
    assert first.close() == 0
    assert second.get_batch(keys) == values
    for k, v in zip(keys, values, strict=True):
        assert second.get(k) == v
        assert second.get_size(k) == len(v)


def test_without_replication_closing_a_store_loses_its_objects(backend: Any) -> None:
    """The control for the test above: the closed segment really takes its replicas with it."""
    first = backend.store()
    second = backend.store(segment=0)  # a pure client: every replica lands in `first`
    keys = [f"single-{i}" for i in range(N)]
    assert first.put_batch(keys, [b"x"] * N) == 0
    assert second.batch_is_exist(keys) == [1] * N
    assert first.close() == 0
    assert second.get_batch(keys) == [b""] * N


def test_objects_whose_segments_all_closed_are_gone(backend: Any) -> None:
    """When every segment holding an object's replicas is unmounted, the object is gone: not
    readable, and not counted by remove_all (Mooncake erases it, ClearInvalidHandles)."""
    first = backend.store()
    second = backend.store()
    cfg = backend.module.ReplicateConfig()
    cfg.replica_num = 2
    keys = [f"gone-{i}" for i in range(N)]
    assert first.put_batch(keys, [b"x"] * N, cfg) == 0
    assert first.close() == 0
    assert second.close() == 0
    third = backend.store()
    assert third.remove_all(True) == 0


def test_preferred_segment_places_the_replica_there(backend: Any) -> None:
    first = backend.store()
    second = backend.store()
    cfg = backend.module.ReplicateConfig()
    cfg.preferred_segments = [second.get_hostname()]
    keys = [f"pref-{i}" for i in range(N)]
    assert first.put_batch(keys, [b"p"] * N, cfg) == 0
    # Every replica sits in `second`'s segment, so closing `first` loses nothing.
    assert first.close() == 0
    assert second.get_batch(keys) == [b"p"] * N


def test_one_store_serves_many_threads(backend: Any) -> None:
    """Mooncake's methods release the GIL and engines call them from many threads."""
    import threading

    store = backend.store()
    errors: list[str] = []

    def worker(t: int) -> None:
        for i in range(40):
            key, value = f"thr-{t}-{i}", f"{t}:{i}".encode() * 50
            if store.put(key, value) != 0:
                errors.append(f"put {key}")
            if store.get(key) != value:
                errors.append(f"get {key}")
            if store.batch_is_exist([key, f"none-{t}"]) != [1, 0]:
                errors.append(f"exist {key}")

    threads = [threading.Thread(target=worker, args=(t,), name=f"compat-{t}") for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    keys = [f"thr-{t}-{i}" for t in range(4) for i in range(40)]
    assert store.batch_remove(keys, True) == [0] * len(keys)


def test_the_async_store_runs_each_call_in_an_executor(backend: Any) -> None:
    import asyncio
    import importlib

    name = (
        "kvpool.compat.mooncake.async_store" if backend.name == "kvpool" else "mooncake.async_store"
    )
    store = importlib.import_module(name).MooncakeDistributedStoreAsync()
    backend._stores.append(store)
    assert store.setup(*backend.setup_args()) == 0

    async def main() -> list[Any]:
        assert await store.async_put("async-1", b"one") == 0
        return list(
            await asyncio.gather(store.async_get("async-1"), store.async_is_exist("async-1"))
        )

    assert asyncio.run(main()) == [b"one", 1]
    assert store.get("async-1") == b"one"
    with pytest.raises(AttributeError):
        _ = store.async_no_such_method
    with pytest.raises(AttributeError):
        _ = store.no_such_attribute


def test_host_memory_from_the_allocator_serves_zero_copy_calls(backend: Any) -> None:
    """SGLang allocates its host KV pool with MooncakeHostMemAllocator, then registers it."""
    import ctypes

    store = backend.store()
    allocator = backend.module.MooncakeHostMemAllocator()
    size = 1 << 20
    ptr = allocator.alloc(size)
    assert ptr != 0 and ptr % 4096 == 0
    try:
        assert store.register_buffer(ptr, size) == 0
        ctypes.memmove(ptr + 4096, b"pooled", 6)
        assert store.put_from("host-pool", ptr + 4096, 6) == 0
        assert store.get_into("host-pool", ptr + 8192, 100) == 6
        assert ctypes.string_at(ptr + 8192, 6) == b"pooled"
        assert store.unregister_buffer(ptr) == 0
    finally:
        assert allocator.free(ptr) == 0
