"""The registered-buffer check of `put_from` / `get_into` and their batches
(kvpool.client.validation.registered_views): a view cut from a registered memoryview of a whole
buffer passes with one lookup, without taking its address; everything else takes the full
check, and what the full check refuses is still refused."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.client import validation
from kvpool.errors import InvalidParams
from kvpool.transfer.registration import MemoryRegistry

SIZE = 4096
BATCH = 16


@pytest.fixture
def registry() -> Iterator[MemoryRegistry]:
    reg = MemoryRegistry([])
    yield reg
    for region in reg.regions():
        reg.unregister(region.addr)


def _count_addresses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = validation.buffer_address

    def counting(mv: memoryview) -> int:
        calls.append(1)
        return real(mv)

    monkeypatch.setattr(validation, "buffer_address", counting)
    return calls


def test_views_of_a_pinned_buffer_take_no_address(
    registry: MemoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = bytearray(SIZE * BATCH)
    whole = memoryview(buf)
    registry.register(whole)
    assert id(buf) in registry.pinned
    views = [whole[i * SIZE : (i + 1) * SIZE] for i in range(BATCH)]
    calls = _count_addresses(monkeypatch)
    got = validation.registered_views(registry, views, writable=True, what="get_into buffer")
    assert got == views and all(a is b for a, b in zip(got, views, strict=True))
    assert calls == []  # on the old check: one address per view
    # A view of the view (same exporter) too.
    again = validation.registered_views(registry, [views[3][10:20]], writable=False, what="x")
    assert again[0].nbytes == 10 and calls == []


def test_pinned_buffer_cannot_move_and_unpins_on_unregister(registry: MemoryRegistry) -> None:
    buf = bytearray(SIZE)
    whole = memoryview(buf)
    registry.register(whole)
    del whole  # the caller drops its view: the registry's own export still pins buf
    with pytest.raises(BufferError):
        buf.extend(b"x")
    registry.unregister(memoryview(buf))
    assert registry.pinned == {}
    buf.extend(b"x")  # no export left behind
    with pytest.raises(InvalidParams, match="not inside memory registered"):
        validation.registered_views(
            registry, [memoryview(buf)[:10]], writable=True, what="get_into buffer"
        )


def test_what_the_full_check_refuses_is_still_refused(registry: MemoryRegistry) -> None:
    buf = bytearray(SIZE * 2)
    registry.register(memoryview(buf))
    whole = memoryview(buf)
    with pytest.raises(InvalidParams, match="empty"):
        validation.registered_views(registry, [whole[:0]], writable=True, what="b")
    with pytest.raises(InvalidParams, match="read-only"):
        validation.registered_views(registry, [whole.toreadonly()[:8]], writable=True, what="b")
    with pytest.raises(InvalidParams, match="C-contiguous"):
        validation.registered_views(registry, [whole[::2]], writable=True, what="b")
    wide = validation.registered_views(registry, [whole.cast("I")], writable=True, what="b")
    assert wide[0].format == "B" and wide[0].nbytes == SIZE * 2
    other = bytearray(SIZE)
    with pytest.raises(InvalidParams, match="not inside memory registered"):
        validation.registered_views(registry, [memoryview(other)], writable=True, what="b")


def test_partial_and_raw_registrations_are_not_pinned(registry: MemoryRegistry) -> None:
    buf = bytearray(SIZE * 2)
    registry.register(memoryview(buf)[:SIZE])  # half of it: views of buf may lie outside
    registry.register(bytearray(SIZE))  # not a memoryview: nothing holds an export
    arr = np.zeros(SIZE, np.uint8)
    registry.register(memoryview(arr))
    assert set(registry.pinned) == {id(arr)}
    with pytest.raises(InvalidParams, match="not inside memory registered"):
        validation.registered_views(
            registry, [memoryview(buf)[SIZE:]], writable=True, what="get_into buffer"
        )
    ok = validation.registered_views(registry, [memoryview(buf)[:8]], writable=True, what="b")
    assert ok[0].nbytes == 8


def test_mmap_is_pinned_and_released(registry: MemoryRegistry) -> None:
    m = mmap.mmap(-1, SIZE)
    try:
        registry.register(memoryview(m))
        assert id(m) in registry.pinned
        registry.unregister(memoryview(m))
        assert registry.pinned == {}
    finally:
        m.close()  # fails with BufferError if an export were left behind


def test_one_buffer_takes_the_same_check(
    registry: MemoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = bytearray(SIZE * 2)
    whole = memoryview(buf)
    registry.register(whole)
    calls = _count_addresses(monkeypatch)
    view = whole[SIZE:]
    assert validation.registered_view(registry, view, writable=True, what="b") is view
    assert calls == []
    with pytest.raises(InvalidParams, match="read-only"):
        validation.registered_view(registry, whole.toreadonly()[:8], writable=True, what="b")
    with pytest.raises(InvalidParams, match="empty"):
        validation.registered_view(registry, whole[:0], writable=False, what="b")
    with pytest.raises(InvalidParams, match="not inside memory registered"):
        validation.registered_view(registry, bytearray(8), writable=False, what="b")
