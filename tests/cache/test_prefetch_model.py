"""Prefetch checked against a model: for any contents of two L2 adapters and of L1, the hits are
exactly the longest prefix held somewhere, the bytes are the stored ones, and nothing stays
locked. Plus a stress run of engine threads storing and prefetching through a faulty L2."""

from __future__ import annotations

import os
import random
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.mock import MockAdapter
from kvpool.cache.config import StorageManagerConfig
from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Config
from kvpool.cache.manager import StorageManager
from kvpool.cache.memory import MemoryLayout, MemoryObj

SIZE = 512
LAYOUT = MemoryLayout.of_bytes(SIZE)


def key(i: int) -> ObjectKey:
    return ObjectKey("model", 0, i.to_bytes(4, "big"))


def value(i: int) -> bytes:
    return bytes([i % 251 + 1]) * SIZE


def put(adapter: MockAdapter, ids: set[int]) -> None:
    if not ids:
        return
    ks = [key(i) for i in sorted(ids)]
    objs = []
    for i, k in zip(sorted(ids), ks, strict=True):
        o = MemoryObj(k, LAYOUT)
        o.write(value(i))
        objs.append(o)
    assert BlockingAdapter(adapter).store(ks, objs).ok


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    in_a=st.sets(st.integers(0, 11)),
    in_b=st.sets(st.integers(0, 11)),
    in_l1=st.sets(st.integers(0, 11)),
)
def test_hits_are_the_longest_prefix_held_anywhere(
    n: int, in_a: set[int], in_b: set[int], in_l1: set[int]
) -> None:
    a, b = MockAdapter(), MockAdapter()
    put(a, in_a)
    put(b, in_b)
    with StorageManager(
        StorageManagerConfig(l1=L1Config(capacity_bytes=1 << 20)), adapters=[a, b]
    ) as sm:
        if in_l1:
            ids = sorted(in_l1)
            res = sm.l1.reserve_write([key(i) for i in ids], LAYOUT)
            for i, r in zip(ids, res, strict=True):
                assert r.obj is not None
                r.obj.write(value(i))
            sm.l1.finish_write([key(i) for i in ids])  # (also stored to L2 in the background)
        keys = [key(i) for i in range(n)]
        held = in_a | in_b | in_l1
        expected = 0
        while expected < n and expected in held:
            expected += 1
        h = sm.submit_prefetch_task(keys, LAYOUT)
        hits = sm.wait_prefetch(h, 10)
        # L1 answers its own prefix; L2 fills gaps; keys L1 holds past a filled gap are read
        # from L1, not loaded again: the hits are exactly the longest prefix held anywhere.
        assert hits == expected
        with sm.read_prefetched_results(keys[:hits]) as objs:
            assert [bytes(o.buffer) for o in objs] == [value(i) for i in range(hits)]
        sm.finish_read_prefetched(keys[:hits])
        assert sm.wait_stores(10)
        assert a.locked_keys() == {} and b.locked_keys() == {}
        assert all(sm.l1.read_lock_count(k) == 0 for k in keys)


def test_engine_threads_storing_and_prefetching_through_a_faulty_l2(
    tmp_path: os.PathLike[str],
) -> None:
    inner = {"type": "fs", "base_path": os.path.join(tmp_path, "l2")}
    faulty = {
        "type": "fault",
        "inner": inner,
        "seed": 3,
        "store_failure_rate": 0.1,
        "load_failure_rate": 0.1,
        "lookup_miss_rate": 0.05,
        "max_delay_s": 0.003,
    }
    cfg = StorageManagerConfig(
        l1=L1Config(capacity_bytes=64 * SIZE), adapters=(faulty,), prefetch_max_in_flight=3
    )  # type: ignore[arg-type]
    errors: list[BaseException] = []
    with StorageManager(cfg) as sm:

        def engine(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(40):  # bounded
                    n = rng.randint(1, 10)
                    keys = [key(i) for i in range(n)]
                    if rng.random() < 0.5:
                        sm.store(keys, [value(i) for i in range(n)], LAYOUT)
                    else:
                        hits = sm.wait_prefetch(sm.submit_prefetch_task(keys, LAYOUT), 20)
                        with sm.read_prefetched_results(keys[:hits]) as objs:
                            for i, o in enumerate(objs):
                                assert bytes(o.buffer) == value(i), f"wrong bytes for key {i}"
                        sm.finish_read_prefetched(keys[:hits])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=engine, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert sm.wait_stores(20)
        usage = sm.l1.usage()
        assert usage.read_locked == 0 and usage.writing == 0 and usage.temporary == 0
        assert sm.prefetch_controller.running() == 0 and sm.prefetch_controller.queued() == 0
