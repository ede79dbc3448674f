"""StorageManager with its store and prefetch controllers, checked against seed 003's invariants.

The adapters are real: the in-memory reference adapter (whose lock table shows every L2 lock a
controller holds), the filesystem adapter, and the failure-injecting proxy around them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence

import pytest

from kvpool.cache.adapters.base import L2TaskId, StoreResult
from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.fault import FaultInjectingAdapter
from kvpool.cache.adapters.mock import MockAdapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.config import StorageManagerConfig
from kvpool.cache.keys import ObjectKey, TokenHasher
from kvpool.cache.l1 import L1Config, L1Status
from kvpool.cache.manager import StorageManager
from kvpool.cache.memory import MemoryLayout, MemoryObj
from kvpool.cache.policy import PrefetchPolicy, register_prefetch_policy
from kvpool.errors import InvalidParams, StoreClosed
from kvtest.procs import wait_until

SIZE = 2048
LAYOUT = MemoryLayout.of_bytes(SIZE)


class RecordingMock(MockAdapter):
    """The reference adapter, plus a record of every batch it was asked to store or load, and
    a snapshot of the locks it held when each load was submitted."""

    def __init__(self) -> None:
        super().__init__()
        self.store_calls: list[list[ObjectKey]] = []
        self.lookup_calls: list[list[ObjectKey]] = []
        self.load_calls: list[list[ObjectKey]] = []
        self.locks_at_load: list[dict[ObjectKey, int]] = []

    def submit_store_task(
        self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
    ) -> L2TaskId:
        self.store_calls.append(list(keys))
        return super().submit_store_task(keys, objects)

    def submit_lookup_and_lock_task(self, keys: Sequence[ObjectKey]) -> L2TaskId:
        self.lookup_calls.append(list(keys))
        return super().submit_lookup_and_lock_task(keys)

    def submit_load_task(self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]) -> L2TaskId:
        self.load_calls.append(list(keys))
        self.locks_at_load.append(self.locked_keys())
        return super().submit_load_task(keys, objects)


def key(i: int, model: str = "llama/3", rank: int = 0) -> ObjectKey:
    return ObjectKey(model, rank, i.to_bytes(8, "big"))


def value(i: int) -> bytes:
    return (i.to_bytes(4, "big") * (SIZE // 4))[:SIZE]


def preload(adapter: MockAdapter, ids: Sequence[int], model: str = "llama/3") -> None:
    ks = [key(i, model) for i in ids]
    objs = []
    for i, k in zip(ids, ks, strict=True):
        o = MemoryObj(k, LAYOUT)
        o.write(value(i))
        objs.append(o)
    assert BlockingAdapter(adapter).store(ks, objs).ok


def manager(
    *adapters: MockAdapter | FaultInjectingAdapter, capacity: int = 1 << 22, **kw: object
) -> StorageManager:
    cfg = StorageManagerConfig(l1=L1Config(capacity_bytes=capacity), **kw)  # type: ignore[arg-type]
    return StorageManager(cfg, adapters=list(adapters))


@pytest.fixture
def closing() -> Iterator[list[StorageManager]]:
    made: list[StorageManager] = []
    try:
        yield made
    finally:
        for m in made:
            m.close()


# -- store path -----------------------------------------------------------------------------


def test_finished_writes_are_stored_to_every_adapter_and_read_locks_released(
    closing: list[StorageManager],
) -> None:
    a, b = RecordingMock(), RecordingMock()
    sm = manager(a, b)
    closing.append(sm)
    ks = [key(i) for i in range(5)]
    assert sm.store(ks, [value(i) for i in range(5)]) == [L1Status.OK] * 5
    assert sm.wait_stores(10)
    for adapter in (a, b):
        assert adapter.stored_keys() == set(ks)
        assert all(adapter.raw_value(k) == value(i) for i, k in enumerate(ks))
    assert all(sm.l1.read_lock_count(k) == 0 for k in ks)
    st = sm.store_stats()
    assert st.stored_keys == 10 and st.failed_tasks == 0


def test_store_batches_hold_one_model_and_kv_rank_each(closing: list[StorageManager]) -> None:
    a = RecordingMock()
    sm = manager(a)
    closing.append(sm)
    ks = [key(0, "m1", 0), key(1, "m1", 1), key(2, "m2", 0), key(3, "m1", 0)]
    sm.store(ks, [value(i) for i in range(4)])
    assert sm.wait_stores(10)
    assert a.stored_keys() == set(ks)
    for batch in a.store_calls:
        assert len({k.group for k in batch}) == 1


def test_failed_store_is_counted_not_retried_and_keeps_the_l1_copy(
    closing: list[StorageManager],
) -> None:
    inner = MockAdapter()
    proxy = FaultInjectingAdapter(inner, seed=1, store_failure_rate=1.0)
    sm = manager(proxy)
    closing.append(sm)
    ks = [key(i) for i in range(3)]
    sm.store(ks, [value(i) for i in range(3)])
    assert sm.wait_stores(10)
    st = sm.store_stats()
    assert st.failed_tasks == 1 and st.submitted_tasks == 1 and st.stored_keys == 0
    assert inner.stored_keys() == set()
    assert all(sm.l1.contains(k) and sm.l1.read_lock_count(k) == 0 for k in ks)
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert h.request is None and sm.query_prefetch_status(h) == 3  # served from L1


def test_store_submit_that_raises_does_not_leak_read_locks(closing: list[StorageManager]) -> None:
    class Broken(MockAdapter):
        def submit_store_task(
            self, keys: Sequence[ObjectKey], objects: Sequence[MemoryObj]
        ) -> L2TaskId:
            raise OSError("disk on fire")

    sm = manager(Broken())
    closing.append(sm)
    sm.store([key(1)], [value(1)])
    assert sm.wait_stores(10)
    assert sm.store_stats().submit_errors == 1
    assert sm.l1.read_lock_count(key(1)) == 0


def test_skip_l1_policy_frees_l1_after_a_successful_store(closing: list[StorageManager]) -> None:
    a = MockAdapter()
    sm = manager(a, store_policy="skip_l1")
    closing.append(sm)
    sm.store([key(1), key(2)], [value(1), value(2)])
    assert sm.wait_stores(10)
    assert a.stored_keys() == {key(1), key(2)}
    assert not sm.l1.contains(key(1)) and not sm.l1.contains(key(2))


# -- prefetch path --------------------------------------------------------------------------


def test_q2_gap_in_l2_loads_exactly_the_contiguous_prefix(closing: list[StorageManager]) -> None:
    a = RecordingMock()
    preload(a, [0, 1, 2, 4, 5])
    sm = manager(a)
    closing.append(sm)
    ks = [key(i) for i in range(6)]
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert sm.wait_prefetch(h, 10) == 3
    assert [set(c) for c in a.load_calls] == [{key(0), key(1), key(2)}]
    # Phase-1 unlock happened before the load: 4 and 5 were no longer locked when it started.
    assert a.locks_at_load == [{key(0): 1, key(1): 1, key(2): 1}]
    assert a.locked_keys() == {}  # phase 2 released the rest
    with sm.read_prefetched_results(ks[:3]) as objs:
        assert [bytes(o.buffer) for o in objs] == [value(0), value(1), value(2)]
    assert not sm.l1.contains(key(4)) and not sm.l1.contains(key(5))
    assert sm.finish_read_prefetched(ks[:3]) == [L1Status.OK] * 3
    # Prefetch buffers are temporary: freed with their last reader, never stored back.
    assert sm.l1.usage().objects == 0
    assert a.store_calls[1:] == []


def test_full_l1_hit_needs_no_l2_round(closing: list[StorageManager]) -> None:
    a = RecordingMock()
    sm = manager(a)
    closing.append(sm)
    ks = [key(i) for i in range(4)]
    sm.store(ks, [value(i) for i in range(4)])
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert h.request is None
    assert sm.query_prefetch_status(h) == 4
    assert a.lookup_calls == []
    assert all(sm.l1.read_lock_count(k) == 1 for k in ks)
    sm.finish_read_prefetched(ks)
    assert all(sm.l1.read_lock_count(k) == 0 for k in ks)


def test_l1_prefix_hits_then_l2_for_the_rest(closing: list[StorageManager]) -> None:
    a = RecordingMock()
    preload(a, [2, 3])
    sm = manager(a)
    closing.append(sm)
    ks = [key(i) for i in range(5)]
    sm.store(ks[:2], [value(0), value(1)])
    assert sm.wait_stores(10)
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert h.l1_hits == 2
    assert sm.wait_prefetch(h, 10) == 4
    assert a.lookup_calls[-1] == ks[2:]  # L2 is asked only for what L1 lacks
    with sm.read_prefetched_results(ks[:4]) as objs:
        assert [bytes(o.buffer) for o in objs] == [value(i) for i in range(4)]
        assert all(sm.l1.read_lock_count(k) == 2 for k in ks[:4])
    sm.finish_read_prefetched(ks[:4])
    assert sm.l1.contains(key(0)) and sm.l1.contains(key(1))  # engine-written: stays
    assert not sm.l1.contains(key(2)) and not sm.l1.contains(key(3))  # temporary: freed


def test_load_plan_gives_each_key_to_one_adapter_lowest_index_first(
    closing: list[StorageManager],
) -> None:
    a, b = RecordingMock(), RecordingMock()
    preload(a, [0, 1])
    preload(b, [0, 1, 2, 3])
    sm = manager(a, b)
    closing.append(sm)
    ks = [key(i) for i in range(4)]
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert sm.wait_prefetch(h, 10) == 4
    assert a.load_calls == [[key(0), key(1)]]
    assert b.load_calls == [[key(2), key(3)]]
    # b found 0 and 1 too but does not load them: released in phase 1, before b's load.
    assert set(b.locks_at_load[0]) == {key(2), key(3)}
    assert a.locked_keys() == {} and b.locked_keys() == {}
    with sm.read_prefetched_results(ks) as objs:
        assert [bytes(o.buffer) for o in objs] == [value(i) for i in range(4)]
    sm.finish_read_prefetched(ks)


def test_spread_policy_deals_shared_keys_round_robin(closing: list[StorageManager]) -> None:
    a, b = RecordingMock(), RecordingMock()
    preload(a, range(4))
    preload(b, range(4))
    sm = manager(a, b, prefetch_policy="spread")
    closing.append(sm)
    ks = [key(i) for i in range(4)]
    assert sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10) == 4
    assert a.load_calls == [[key(0), key(2)]] and b.load_calls == [[key(1), key(3)]]
    sm.finish_read_prefetched(ks)


def test_bad_policy_plan_is_refused_and_the_default_plan_used(
    closing: list[StorageManager],
) -> None:
    class Greedy(PrefetchPolicy):
        def select_load_plan(self, keys, lookup_results, adapters):  # type: ignore[no-untyped-def]
            return {i: Bitmap(len(keys), len(keys)) for i in lookup_results}  # overlaps

    register_prefetch_policy("greedy-test", Greedy)
    a, b = RecordingMock(), RecordingMock()
    preload(a, [0])
    preload(b, [0, 1])
    sm = manager(a, b, prefetch_policy="greedy-test")
    closing.append(sm)
    ks = [key(0), key(1)]
    assert sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10) == 2
    assert sm.prefetch_stats().plan_errors == 1
    assert a.load_calls == [[key(0)]] and b.load_calls == [[key(1)]]
    sm.finish_read_prefetched(ks)


def test_failed_loads_shorten_the_prefix_and_never_return_wrong_bytes(
    closing: list[StorageManager],
) -> None:
    inner = MockAdapter()
    n = 8
    preload(inner, range(n))
    proxy = FaultInjectingAdapter(inner, seed=11, load_failure_rate=0.15, max_delay_s=0.002)
    sm = manager(proxy)
    closing.append(sm)
    ks = [key(i) for i in range(n)]
    shortened = 0
    for _ in range(30):
        h = sm.submit_prefetch_task(ks, LAYOUT)
        hits = sm.wait_prefetch(h, 10)
        shortened += hits < n
        with sm.read_prefetched_results(ks[:hits]) as objs:
            for i, o in enumerate(objs):
                assert bytes(o.buffer) == value(i)
        sm.finish_read_prefetched(ks[:hits])
        assert sm.l1.usage().objects == 0  # failed buffers were discarded, not kept
    assert shortened > 0 and proxy.injected_load_failures > 0
    wait_until(lambda: inner.locked_keys() == {}, 5, what="all L2 locks released")


def test_lookup_misses_from_the_proxy_release_the_hidden_locks(
    closing: list[StorageManager],
) -> None:
    inner = MockAdapter()
    preload(inner, range(6))
    proxy = FaultInjectingAdapter(inner, seed=5, lookup_miss_rate=0.3)
    sm = manager(proxy)
    closing.append(sm)
    ks = [key(i) for i in range(6)]
    for _ in range(10):
        hits = sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10)
        sm.finish_read_prefetched(ks[:hits])
    assert proxy.injected_lookup_misses > 0
    wait_until(lambda: inner.locked_keys() == {}, 5, what="all L2 locks released")


def test_full_l1_cuts_the_prefix_and_releases_unused_l2_locks(
    closing: list[StorageManager],
) -> None:
    a = RecordingMock()
    preload(a, range(4))
    sm = manager(a, capacity=2 * SIZE)
    closing.append(sm)
    ks = [key(i) for i in range(4)]
    assert sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10) == 2
    assert a.load_calls == [[key(0), key(1)]]
    assert a.locked_keys() == {}
    assert sm.prefetch_stats().l1_refusals == 1
    sm.finish_read_prefetched(ks[:2])


def test_at_most_max_in_flight_requests_run_and_the_rest_queue(
    closing: list[StorageManager],
) -> None:
    inner = MockAdapter()
    preload(inner, range(4))
    proxy = FaultInjectingAdapter(inner, seed=3, max_delay_s=0.02)
    sm = manager(proxy, prefetch_max_in_flight=2)
    closing.append(sm)
    handles = [sm.submit_prefetch_task([key(i)], LAYOUT) for i in range(4) for _ in range(3)]
    # Same key in concurrent requests: one reserves the L1 buffer, the others see it being
    # written and answer 0; every request finishes and none returns unverified bytes.
    results = [sm.wait_prefetch(h, 20) for h in handles]
    assert all(r in (0, 1) for r in results) and sum(results) >= 4
    st = sm.prefetch_stats()
    assert st.max_in_flight_seen == 2 and st.completed == 12
    for h, r in zip(handles, results, strict=True):
        sm.finish_read_prefetched(list(h.keys[:r]))
    wait_until(lambda: inner.locked_keys() == {}, 5, what="all L2 locks released")


def test_engine_written_chunks_are_reused_by_another_instance_through_fs(
    tmp_path: os.PathLike[str], closing: list[StorageManager]
) -> None:
    spec = {"type": "fs", "base_path": os.path.join(tmp_path, "l2")}
    hasher = TokenHasher(chunk_size=16)
    tokens = list(range(100))
    ks = hasher.keys("org/model", 0, tokens)
    values = [os.urandom(SIZE) for _ in ks]
    writer = StorageManager(StorageManagerConfig(adapters=(spec,)))  # type: ignore[arg-type]
    closing.append(writer)
    writer.store(ks, values)
    assert writer.wait_stores(10) and writer.store_stats().stored_keys == len(ks)
    reader = StorageManager(StorageManagerConfig(adapters=(spec,)))  # type: ignore[arg-type]
    closing.append(reader)
    again = TokenHasher(chunk_size=16).keys("org/model", 0, tokens)  # recomputed, same keys
    hits = reader.wait_prefetch(reader.submit_prefetch_task(again, LAYOUT), 10)
    assert hits == len(ks) == 6
    with reader.read_prefetched_results(again) as objs:
        assert [bytes(o.buffer) for o in objs] == values
    reader.finish_read_prefetched(again)


def test_close_with_prefetches_in_flight_answers_them_and_leaks_nothing() -> None:
    before = threading.active_count()
    inner = MockAdapter()
    preload(inner, range(4))
    proxy = FaultInjectingAdapter(inner, seed=2, max_delay_s=5.0)
    sm = manager(proxy)
    handles = [sm.submit_prefetch_task([key(i)], LAYOUT) for i in range(4)]
    sm.close()
    sm.close()
    assert [sm.query_prefetch_status(h) for h in handles] == [0, 0, 0, 0]
    with pytest.raises(StoreClosed):
        sm.submit_prefetch_task([key(0)], LAYOUT)
    wait_until(lambda: threading.active_count() <= before, 10, what="controller threads to end")


def test_entry_points_validate_their_input(closing: list[StorageManager]) -> None:
    sm = manager(MockAdapter())
    closing.append(sm)
    with pytest.raises(InvalidParams):
        sm.submit_prefetch_task(["k"], LAYOUT)  # type: ignore[list-item]
    with pytest.raises(InvalidParams):
        sm.submit_prefetch_task([key(0)], "2KiB")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        sm.store([key(0)], [])
    with pytest.raises(InvalidParams):
        sm.query_prefetch_status(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidParams), sm.read_prefetched_results([key(9)]):
        pass


def test_two_adapters_sharing_an_eventfd_are_refused() -> None:
    class Twin(MockAdapter):
        def __init__(self, other: MockAdapter) -> None:
            super().__init__()
            self._other = other

        def get_store_event_fd(self) -> int:
            return self._other.get_store_event_fd()

    a = MockAdapter()
    with pytest.raises(InvalidParams):
        StorageManager(adapters=[a, Twin(a)])


def test_large_groups_are_split_into_bounded_store_tasks(closing: list[StorageManager]) -> None:
    a = RecordingMock()
    sm = manager(a, store_max_keys_per_task=16)
    closing.append(sm)
    ks = [key(i) for i in range(40)]
    sm.store(ks, [value(i) for i in range(40)])
    assert sm.wait_stores(10)
    assert [len(c) for c in a.store_calls] == [16, 16, 8]
    assert a.stored_keys() == set(ks)
    assert all(sm.l1.read_lock_count(k) == 0 for k in ks)


def test_a_key_l1_holds_past_a_gap_that_l2_fills_is_read_from_l1_not_loaded(
    closing: list[StorageManager],
) -> None:
    a = RecordingMock()
    preload(a, [0])
    sm = manager(a)
    closing.append(sm)
    sm.store([key(1)], [value(1)])  # L1 holds 1 (and the store controller copies it to L2)
    assert sm.wait_stores(10)
    ks = [key(0), key(1)]
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert h.l1_hits == 0
    assert sm.wait_prefetch(h, 10) == 2
    assert a.load_calls == [[key(0)]]  # key 1 came from L1
    assert a.locked_keys() == {}
    with sm.read_prefetched_results(ks) as objs:
        assert [bytes(o.buffer) for o in objs] == [value(0), value(1)]
    sm.finish_read_prefetched(ks)
    assert sm.l1.contains(key(1)) and not sm.l1.contains(key(0))


def test_an_adapter_fault_fails_one_request_and_late_lookup_locks_are_still_released(
    closing: list[StorageManager],
) -> None:
    class Faulty(MockAdapter):
        def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
            raise RuntimeError("adapter bug")

    inner = MockAdapter()
    preload(inner, [0, 1])
    slow = FaultInjectingAdapter(inner, seed=4, max_delay_s=0.2)
    sm = manager(Faulty(), slow)
    closing.append(sm)
    ks = [key(0), key(1)]
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert sm.wait_prefetch(h, 10) == 0  # this request failed alone ...
    wait_until(lambda: inner.locked_keys() == {}, 10, what="late lookup locks released")
    assert sm.prefetch_controller.running() == 0
    assert sm.l1.usage().objects == 0


class Silent(MockAdapter):
    """Takes lookups and never answers them: an L2 whose replies are lost."""

    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        self.queries += 1
        return None


def test_an_orphaned_lookup_that_never_answers_is_dropped_at_its_deadline(
    closing: list[StorageManager],
) -> None:
    class Faulty(MockAdapter):
        def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
            raise RuntimeError("adapter bug")

    silent = Silent()
    sm = manager(Faulty(), silent, prefetch_lookup_timeout_s=0.2)
    closing.append(sm)
    ctl = sm.prefetch_controller
    h = sm.submit_prefetch_task([key(0)], LAYOUT)
    assert sm.wait_prefetch(h, 10) == 0  # failed alone; the silent lookup is orphaned
    wait_until(lambda: ctl.stats().orphans_dropped == 1, 10, what="the orphan dropped")
    assert ctl.orphans() == 0 and ctl.running() == 0  # nothing left to poll
    assert silent.queries >= 1


def test_a_lookup_that_never_answers_is_planned_as_a_miss_after_the_deadline(
    closing: list[StorageManager],
) -> None:
    a = RecordingMock()
    preload(a, [0, 1])
    silent = Silent()
    sm = manager(a, silent, prefetch_lookup_timeout_s=0.2)
    closing.append(sm)
    ks = [key(0), key(1)]
    h = sm.submit_prefetch_task(ks, LAYOUT)
    assert sm.wait_prefetch(h, 10) == 2  # the other adapter's hits, without the silent one
    assert a.locked_keys() == {}
    with sm.read_prefetched_results(ks) as objs:
        assert [bytes(o.buffer) for o in objs] == [value(0), value(1)]
    sm.finish_read_prefetched(ks)
    ctl = sm.prefetch_controller
    assert ctl.stats().lookup_timeouts == 1
    wait_until(lambda: ctl.stats().orphans_dropped == 1, 10, what="the late lookup dropped")
    assert ctl.orphans() == 0 and ctl.running() == 0


def test_the_controller_keeps_serving_after_a_failed_request(closing: list[StorageManager]) -> None:
    class FlakyOnce(MockAdapter):
        failed = False

        def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
            if not FlakyOnce.failed:
                FlakyOnce.failed = True
                raise RuntimeError("transient adapter bug")
            return super().query_load_result(task_id)

    a = FlakyOnce()
    preload(a, [0, 1])
    sm = manager(a)
    closing.append(sm)
    ks = [key(0), key(1)]
    assert sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10) == 0
    assert sm.l1.usage().objects == 0  # the failed request's buffers were discarded
    assert sm.wait_prefetch(sm.submit_prefetch_task(ks, LAYOUT), 10) == 2
    sm.finish_read_prefetched(ks)
    assert a.locked_keys() == {}


def test_an_adapter_whose_completions_fail_does_not_starve_the_others(
    closing: list[StorageManager],
) -> None:
    class Broken(MockAdapter):
        def pop_completed_store_tasks(self) -> dict[L2TaskId, StoreResult]:
            raise RuntimeError("adapter bug")

    good = MockAdapter()
    sm = manager(Broken(), good)
    closing.append(sm)
    sm.store([key(1)], [value(1)])
    wait_until(lambda: good.stored_keys() == {key(1)}, 10, what="the healthy adapter's store")
    wait_until(lambda: sm.store_stats().stored_keys == 1, 10, what="its completion")
