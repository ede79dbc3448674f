"""Memory registration rules (kvpool/transfer/registration.py), one per test."""

from __future__ import annotations

import ctypes
import mmap
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError, TransferError
from kvpool.transfer import AddressOverlapped, MemoryRegion, Transport
from kvpool.transfer.registration import MemoryRegistry, buffer_address, byte_view


class RecordingTransport(Transport):
    """A real Transport implementation that records calls and fails on request."""

    def __init__(self, name: str, log: list[str], fail_on: int | None = None) -> None:
        self.name = name
        self.log = log
        self.fail_on = fail_on  # fail the register of a region starting at this address
        self.fail_unregister = False
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def register_memory(self, region: MemoryRegion) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if region.addr == self.fail_on:
            self.log.append(f"{self.name}:fail:{region.addr:#x}")
            raise TransferError(f"{self.name} refuses")
        self.log.append(f"{self.name}:reg:{region.addr:#x}")

    def unregister_memory(self, region: MemoryRegion) -> None:
        if self.fail_unregister:
            self.log.append(f"{self.name}:unreg-fail:{region.addr:#x}")
            raise KVPoolError(f"{self.name} cannot unregister", ErrorCode.INTERNAL_ERROR)
        self.log.append(f"{self.name}:unreg:{region.addr:#x}")

    def close(self) -> None:
        pass


def addr_of(buf: object) -> int:
    return buffer_address(byte_view(buf))


def test_zero_length_is_refused() -> None:
    reg = MemoryRegistry([])
    with pytest.raises(InvalidParams):
        reg.register(bytearray(0))
    with pytest.raises(InvalidParams):
        reg.register(addr_of(bytearray(16)), 0)
    with pytest.raises(InvalidParams):
        reg.register(addr_of(bytearray(16)))  # an address without a length


def test_overlap_with_a_registered_region_is_refused() -> None:
    reg = MemoryRegistry([])
    buf = bytearray(8192)
    base = addr_of(buf)
    reg.register(base, 4096)
    with pytest.raises(AddressOverlapped) as info:
        reg.register(base + 4095, 100)
    assert info.value.code is ErrorCode.INVALID_PARAMS
    with pytest.raises(AddressOverlapped):
        reg.register(base - 10 if base > 10 else base, 20)
    reg.register(base + 4096, 4096)  # adjacent is fine
    assert [r.addr for r in reg.regions()] == [base, base + 4096]


def test_overlap_with_a_region_still_reserving_is_refused() -> None:
    log: list[str] = []
    slow = RecordingTransport("slow", log)
    slow.gate = threading.Event()
    reg = MemoryRegistry([slow])
    buf = bytearray(4096)
    base = addr_of(buf)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(reg.register(base, 4096)))
    t.start()
    try:
        assert slow.entered.wait(10)  # the first registration is reserving, not yet done
        with pytest.raises(AddressOverlapped):
            reg.register(base + 100, 10)
        assert reg.find(base, 10) is None  # reserving is not registered
    finally:
        slow.gate.set()
        t.join(10)
    assert result == [MemoryRegion(base, 4096)]
    assert reg.find(base + 10, 10) == MemoryRegion(base, 4096)


def test_a_failing_transport_rolls_back_the_others_in_reverse_order() -> None:
    log: list[str] = []
    buf = bytearray(4096)
    base = addr_of(buf)
    a, b = RecordingTransport("a", log), RecordingTransport("b", log)
    c = RecordingTransport("c", log, fail_on=base)
    reg = MemoryRegistry([a, b, c])
    with pytest.raises(TransferError):
        reg.register(buf)
    assert log == [
        f"a:reg:{base:#x}",
        f"b:reg:{base:#x}",
        f"c:fail:{base:#x}",
        f"b:unreg:{base:#x}",
        f"a:unreg:{base:#x}",
    ]
    assert reg.regions() == []
    c.fail_on = None
    reg.register(buf)  # the reservation was released: the same range registers now
    assert reg.regions() == [MemoryRegion(base, 4096)]


def test_batch_is_sorted_checked_for_neighbour_overlap_and_all_or_nothing() -> None:
    log: list[str] = []
    buf = bytearray(3 * 4096)
    base = addr_of(buf)
    reg = MemoryRegistry([RecordingTransport("t", log)])
    with pytest.raises(AddressOverlapped):  # given out of order; neighbours overlap
        reg.register_many([(base + 8192, 4096), (base, 4096), (base + 4000, 200)])
    assert log == [] and reg.regions() == []
    with pytest.raises(InvalidParams):  # one zero length refuses the batch
        reg.register_many([(base, 4096), (base + 4096, 0)])
    assert reg.regions() == []
    regions = reg.register_many([(base + 8192, 4096), (base, 4096)])
    assert regions == [MemoryRegion(base + 8192, 4096), MemoryRegion(base, 4096)]
    assert [r.addr for r in reg.regions()] == [base, base + 8192]


def test_batch_fails_whole_when_a_transport_fails_on_one_member() -> None:
    log: list[str] = []
    buf = bytearray(2 * 4096)
    base = addr_of(buf)
    reg = MemoryRegistry([RecordingTransport("t", log, fail_on=base + 4096)])
    with pytest.raises(TransferError):
        reg.register_many([(base, 4096), (base + 4096, 4096)])
    assert reg.regions() == []
    assert log[-1] == f"t:unreg:{base:#x}"  # the first member was rolled back


def test_batch_overlapping_what_is_registered_is_refused() -> None:
    buf = bytearray(2 * 4096)
    base = addr_of(buf)
    reg = MemoryRegistry([])
    reg.register(base, 4096)
    with pytest.raises(AddressOverlapped):
        reg.register_many([(base + 4096, 4096), (base + 100, 10)])
    assert reg.regions() == [MemoryRegion(base, 4096)]


def test_unregister_is_best_effort_and_reports_the_first_error() -> None:
    log: list[str] = []
    a, b, c = (RecordingTransport(n, log) for n in "abc")
    reg = MemoryRegistry([a, b, c])
    buf = bytearray(4096)
    base = addr_of(buf)
    reg.register(buf)
    log.clear()
    b.fail_unregister = c.fail_unregister = True
    with pytest.raises(KVPoolError) as info:
        reg.unregister(buf)
    assert "b cannot" in str(info.value)
    assert log == [f"a:unreg:{base:#x}", f"b:unreg-fail:{base:#x}", f"c:unreg-fail:{base:#x}"]
    assert reg.regions() == [MemoryRegion(base, 4096)]  # kept: not every transport let go
    b.fail_unregister = c.fail_unregister = False
    reg.unregister(base)
    assert reg.regions() == []
    with pytest.raises(InvalidParams):
        reg.unregister(base)  # unknown now


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "mmap", "numpy", "ctypes-ptr"])
def test_every_kind_of_buffer_registers(kind: str) -> None:
    reg = MemoryRegistry([])
    keep: object
    if kind == "bytearray":
        keep = bytearray(4096)
        region = reg.register(keep)
    elif kind == "memoryview":
        keep = bytearray(8192)
        region = reg.register(memoryview(keep)[4096:])
    elif kind == "mmap":
        keep = mmap.mmap(-1, 4096)
        region = reg.register(keep)
    elif kind == "numpy":
        keep = np.zeros((16, 64), dtype=np.float32)
        region = reg.register(keep)
    else:  # a raw data pointer, as a torch tensor's data_ptr() gives
        keep = (ctypes.c_char * 4096)()
        region = reg.register(ctypes.addressof(keep), 4096)
    assert region.length == 4096
    assert reg.find(region.addr, region.length) == region
    reg.unregister(region.addr)
    if isinstance(keep, mmap.mmap):
        keep.close()


def test_non_contiguous_buffers_are_refused() -> None:
    reg = MemoryRegistry([])
    with pytest.raises(InvalidParams):
        reg.register(np.zeros((8, 8))[:, ::2])
    with pytest.raises(InvalidParams):
        reg.register(object())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 60), st.integers(1, 12)),
        min_size=1,
        max_size=40,
    )
)
def test_registry_matches_a_simple_model(ops: list[tuple[bool, int, int]]) -> None:
    """Random registers and unregisters of ranges in [1, 72) behave like a list of intervals."""
    reg = MemoryRegistry([])
    model: dict[int, int] = {}  # start -> length
    for is_register, addr, length in ops:
        if is_register:
            overlaps = any(a < addr + length and addr < a + n for a, n in model.items())
            if overlaps:
                with pytest.raises(AddressOverlapped):
                    reg.register(addr, length)
            else:
                assert reg.register(addr, length) == MemoryRegion(addr, length)
                model[addr] = length
        elif addr in model:
            reg.unregister(addr)
            del model[addr]
        else:
            with pytest.raises(InvalidParams):
                reg.unregister(addr)
        assert reg.regions() == [MemoryRegion(a, model[a]) for a in sorted(model)]
        for a, n in model.items():
            assert reg.find(a + n - 1, 1) == MemoryRegion(a, n)
