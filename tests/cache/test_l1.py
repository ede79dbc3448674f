"""L1 manager: lock states, TTLs (with an injected clock), temporary objects, LRU eviction above
the watermark of unlocked objects only, listeners inside the lock without re-entry."""

from __future__ import annotations

import threading

import pytest

from kvpool.cache.keys import ObjectKey
from kvpool.cache.l1 import L1Config, L1Listener, L1Manager, L1Status, ListenerReentryError
from kvpool.cache.memory import MemoryLayout
from kvpool.errors import InvalidParams, StoreClosed

KB = MemoryLayout.of_bytes(1024)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def k(i: int) -> ObjectKey:
    return ObjectKey("m", 0, i.to_bytes(4, "big"))


def make(
    capacity: int = 10 * 1024, watermark: float = 1.0, clock: Clock | None = None
) -> L1Manager:
    return L1Manager(
        L1Config(
            capacity_bytes=capacity, write_ttl_s=10, read_ttl_s=5, eviction_watermark=watermark
        ),
        clock=clock or Clock(),
    )


def put(l1: L1Manager, *ids: int) -> None:
    res = l1.reserve_write([k(i) for i in ids], KB)
    assert all(r.status is L1Status.OK for r in res)
    for r, i in zip(res, ids, strict=True):
        assert r.obj is not None
        r.obj.array[:] = i
    assert l1.finish_write([k(i) for i in ids]) == [L1Status.OK] * len(ids)


def test_written_object_is_invisible_until_finish_write() -> None:
    l1 = make()
    (res,) = l1.reserve_write([k(1)], KB)
    assert res.status is L1Status.OK and res.obj is not None and res.obj.size == 1024
    assert l1.reserve_read([k(1)])[0].status is L1Status.NOT_READY
    assert l1.reserve_write([k(1)], KB)[0].status is L1Status.EXISTS
    assert l1.finish_write([k(1)]) == [L1Status.OK]
    r = l1.reserve_read([k(1)])[0]
    assert r.status is L1Status.OK and r.obj is res.obj
    assert l1.finish_write([k(1)]) == [L1Status.WRONG_STATE]
    assert l1.reserve_read([k(2)])[0].status is L1Status.NOT_FOUND


def test_read_locks_count_and_block_delete() -> None:
    l1 = make()
    put(l1, 1)
    l1.reserve_read([k(1)])
    l1.reserve_read([k(1)])
    assert l1.read_lock_count(k(1)) == 2
    assert l1.delete([k(1)]) == [L1Status.LOCKED]
    assert l1.finish_read([k(1), k(1)]) == [L1Status.OK, L1Status.OK]
    assert l1.finish_read([k(1)]) == [L1Status.WRONG_STATE]
    assert l1.delete([k(1)]) == [L1Status.OK]
    assert l1.usage().used_bytes == 0


def test_lru_eviction_above_watermark_takes_only_unlocked_objects() -> None:
    l1 = make(capacity=4 * 1024, watermark=0.75)  # eviction starts above 3 KiB
    put(l1, 1, 2, 3)
    l1.reserve_read([k(1)])  # locked: must survive
    l1.reserve_read([k(3)])
    l1.finish_read([k(3)])  # touched: now most recently used
    put(l1, 4)
    assert l1.contains(k(1)) and l1.contains(k(3)) and l1.contains(k(4))
    assert not l1.contains(k(2))  # the LRU unlocked object went
    assert l1.evicted_count == 1
    assert l1.usage().used_bytes == 3 * 1024


def test_allocation_fails_only_when_everything_is_locked() -> None:
    l1 = make(capacity=2 * 1024, watermark=0.5)
    res = l1.reserve_write([k(1), k(2)], KB)  # both write-locked
    assert [r.status for r in res] == [L1Status.OK, L1Status.OK]
    assert l1.reserve_write([k(3)], KB)[0].status is L1Status.OUT_OF_MEMORY
    l1.finish_write([k(1)])
    assert l1.reserve_write([k(3)], KB)[0].status is L1Status.OK  # evicted k1
    assert not l1.contains(k(1))


def test_temporary_object_is_freed_with_its_last_reader_and_never_announced() -> None:
    l1 = make()
    seen: list[list[ObjectKey]] = []

    class Listener(L1Listener):
        def on_keys_write_finished(self, keys: list[ObjectKey]) -> None:
            seen.append(keys)

    l1.register_listener(Listener())
    l1.reserve_write([k(1)], KB, temporary=True)
    (r,) = l1.finish_write_and_reserve_read([k(1)])
    assert r.status is L1Status.OK and l1.read_lock_count(k(1)) == 1
    l1.reserve_read([k(1)])
    l1.finish_read([k(1)])
    assert l1.contains(k(1))
    l1.finish_read([k(1)])
    assert not l1.contains(k(1))
    assert l1.usage().objects == 0
    assert seen == []


def test_finish_write_and_reserve_read_leaves_no_eviction_window() -> None:
    # Fill L1 with the prefetched object plus a full set of unlocked ones and hammer allocation
    # from another thread: the transitioned object is never evicted.
    l1 = make(capacity=8 * 1024, watermark=0.5)
    stop = threading.Event()

    def pressure() -> None:
        i = 100
        while not stop.is_set() and i < 5000:
            res = l1.reserve_write([k(i)], KB)
            if res[0].status is L1Status.OK:
                l1.finish_write([k(i)])
            i += 1

    for _ in range(50):
        l1.reserve_write([k(1)], KB, temporary=True)
        t = threading.Thread(target=pressure)
        t.start()
        try:
            (r,) = l1.finish_write_and_reserve_read([k(1)])
            assert r.status is L1Status.OK
            assert l1.read_locked([k(1)]) == [r.obj]
        finally:
            stop.set()
            t.join(timeout=10)
            stop.clear()
        assert l1.finish_read([k(1)]) == [L1Status.OK]


def test_abandoned_write_reservation_expires_and_frees_memory() -> None:
    clock = Clock()
    l1 = make(capacity=2 * 1024, watermark=1.0, clock=clock)
    l1.reserve_write([k(1), k(2)], KB)  # the writer "crashes"
    assert l1.reserve_write([k(3)], KB)[0].status is L1Status.OUT_OF_MEMORY
    clock.now += 11  # past write_ttl_s
    assert l1.reserve_write([k(3)], KB)[0].status is L1Status.OK
    assert l1.finish_write([k(1), k(2)]).count(L1Status.NOT_FOUND) >= 1
    assert l1.expired_count >= 1


def test_expired_read_lock_no_longer_pins_memory() -> None:
    clock = Clock()
    l1 = make(capacity=1024, watermark=1.0, clock=clock)
    put(l1, 1)
    l1.reserve_read([k(1)])  # the reader "crashes"
    assert l1.reserve_write([k(2)], KB)[0].status is L1Status.OUT_OF_MEMORY
    clock.now += 6  # past read_ttl_s
    assert l1.reserve_write([k(2)], KB)[0].status is L1Status.OK
    assert not l1.contains(k(1))


def test_sweep_frees_temporaries_whose_readers_expired() -> None:
    clock = Clock()
    l1 = make(clock=clock)
    l1.reserve_write([k(1)], KB, temporary=True)
    l1.finish_write_and_reserve_read([k(1)])
    assert l1.sweep() == 0
    clock.now += 6
    assert l1.sweep() == 1
    assert l1.usage().objects == 0


def test_listener_runs_inside_the_lock_and_cannot_reenter() -> None:
    l1 = make()
    errors: list[BaseException] = []
    finished: list[ObjectKey] = []
    removed: list[ObjectKey] = []

    class Reentrant(L1Listener):
        def on_keys_write_finished(self, keys: list[ObjectKey]) -> None:
            finished.extend(keys)
            try:
                l1.reserve_read(keys)
            except ListenerReentryError as exc:
                errors.append(exc)

        def on_keys_removed(self, keys: list[ObjectKey]) -> None:
            removed.extend(keys)

    l1.register_listener(Reentrant())
    put(l1, 1, 2)
    assert finished == [k(1), k(2)]
    assert len(errors) == 1  # refused, not deadlocked
    assert l1.read_lock_count(k(1)) == 0
    l1.delete([k(1)])
    assert removed == [k(1)]


def test_abort_write_discards_without_admitting() -> None:
    l1 = make()
    l1.reserve_write([k(1)], KB)
    assert l1.abort_write([k(1), k(2)]) == [L1Status.OK, L1Status.NOT_FOUND]
    assert l1.usage().used_bytes == 0
    put(l1, 3)
    assert l1.abort_write([k(3)]) == [L1Status.WRONG_STATE]


def test_reserve_read_prefix_stops_at_first_miss() -> None:
    l1 = make()
    put(l1, 1, 2, 4)
    objs = l1.reserve_read_prefix([k(1), k(2), k(3), k(4)])
    assert [o.key for o in objs] == [k(1), k(2)]
    assert l1.read_lock_count(k(4)) == 0


def test_public_entry_points_validate_and_refuse_after_close() -> None:
    l1 = make()
    with pytest.raises(InvalidParams):
        l1.reserve_write(["x"], KB)  # type: ignore[list-item]
    with pytest.raises(InvalidParams):
        l1.reserve_write([k(1)], "1KiB")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        L1Config(capacity_bytes=0)
    with pytest.raises(InvalidParams):
        L1Config(eviction_watermark=1.5)
    with pytest.raises(InvalidParams):
        l1.read_locked([k(9)])
    l1.close()
    l1.close()
    with pytest.raises(StoreClosed):
        l1.reserve_read([k(1)])


def test_typed_views_share_memory() -> None:
    layout = MemoryLayout(((2, 4), (3,)), ("float16", "int32"))
    assert layout.nbytes == 2 * 4 * 2 + 3 * 4
    l1 = make()
    (r,) = l1.reserve_write([k(1)], layout)
    assert r.obj is not None
    a, b = r.obj.arrays()
    a[:] = 1.5
    b[:] = 7
    assert r.obj.arrays()[0].tolist() == [[1.5] * 4] * 2
    assert bytes(r.obj.buffer)[16:20] == (7).to_bytes(4, "little")
    with pytest.raises(InvalidParams):
        MemoryLayout(((2,),), ("float16", "int8"))


def test_tensors_view_the_same_memory_when_torch_is_installed() -> None:
    torch = pytest.importorskip("torch")
    l1 = make()
    (r,) = l1.reserve_write([k(1)], MemoryLayout(((2, 3),), ("float16",)))
    assert r.obj is not None
    (t,) = r.obj.tensors()
    assert t.dtype == torch.float16 and tuple(t.shape) == (2, 3)
    t.fill_(2.0)
    assert r.obj.arrays()[0].tolist() == [[2.0] * 3] * 2


def test_memory_of_dropped_objects_is_reused_only_once_nothing_else_holds_it() -> None:
    l1 = make(capacity=4 * 1024)
    put(l1, 1)
    addr = l1.reserve_read([k(1)])[0].obj.array.ctypes.data  # type: ignore[union-attr]
    l1.finish_read([k(1)])
    l1.delete([k(1)])
    (r,) = l1.reserve_write([k(2)], KB)
    assert r.obj is not None and r.obj.array.ctypes.data == addr  # recycled: no new page faults
    # An outside view (an adapter's buffer, an engine's tensor) pins the old memory.
    pinned = r.obj.buffer
    l1.abort_write([k(2)])
    del r
    (r2,) = l1.reserve_write([k(3)], KB)
    assert r2.obj is not None and r2.obj.array.ctypes.data != addr
    pinned[:4] = b"safe"  # still valid memory, and nobody else's


def test_recycled_memory_counts_against_capacity() -> None:
    l1 = make(capacity=4 * 1024)
    put(l1, 1, 2, 3, 4)
    l1.delete([k(1), k(2), k(3), k(4)])
    assert l1.usage().recycled_bytes == 4 * 1024
    big = MemoryLayout.of_bytes(4 * 1024)
    (r,) = l1.reserve_write([k(9)], big)  # needs every byte: the recycled arrays are released
    assert r.status is L1Status.OK
    assert l1.usage().used_bytes == 4 * 1024
    assert l1.usage().recycled_bytes == 0
