"""Memory registration: which ranges of this process's memory a transfer may name by address.

Rules:

* zero length is refused; a range overlapping a registered *or still reserving* range is
  refused with `AddressOverlapped` (Mooncake's ERR_ADDRESS_OVERLAPPED; INVALID_PARAMS here);
* a range is first reserved, then registered on every transport in turn; when one fails, the
  transports already done are rolled back in reverse order, the reservation is dropped and the
  error raised; only full success moves it from reserving to registered;
* a batch is sorted by address, checked for zero lengths and for overlaps between neighbours
  and with what is registered, then registered all-or-nothing;
* deregistration is best effort: every transport is asked, the first error is remembered, and
  only when none failed is the range forgotten (and the error raised otherwise).

A registration given a Python buffer keeps a reference to it, so the memory cannot be freed
while registered. When that buffer is a memoryview covering the whole of its exporter (a
bytearray, an mmap, a numpy array), the exporter is *pinned*: the registry holds one more export
of it (so it can neither be resized nor moved while registered) and `pinned` maps its id to the
region, so a view cut from it (`memoryview.obj` is the exporter) is known to lie inside without
taking its address (`kvpool.client.validation.registered_views`). A raw address (a torch tensor's `data_ptr()`, a ctypes pointer) is trusted as
given; the caller keeps it alive until `unregister`.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import itertools
import mmap
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvpool.errors import ErrorCode, InvalidParams, KVPoolError
from kvpool.transfer.base import MemoryRegion, Transport

__all__ = [
    "AddressOverlapped",
    "BufferLike",
    "MemoryRegistry",
    "buffer_address",
    "byte_view",
    "view_at",
]

BufferLike = object
"""Anything with the buffer protocol (bytearray, memoryview, mmap, numpy array, ...)."""


class AddressOverlapped(InvalidParams):
    """The range overlaps one that is registered or being registered (ERR_ADDRESS_OVERLAPPED)."""

    default_code = ErrorCode.INVALID_PARAMS


def byte_view(obj: object, *, writable: bool = False, what: str = "buffer") -> memoryview:
    """`obj` as a flat, C-contiguous memoryview of bytes (format 'B')."""
    try:
        mv = obj if isinstance(obj, memoryview) else memoryview(obj)  # type: ignore[arg-type]
    except TypeError as exc:
        raise InvalidParams(f"{what}: {type(obj).__name__} has no buffer protocol") from exc
    if not mv.c_contiguous:
        raise InvalidParams(f"{what}: memory is not C-contiguous")
    if writable and mv.readonly:
        raise InvalidParams(f"{what}: memory is read-only but must be written")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def buffer_address(mv: memoryview) -> int:
    """The address of the first byte of a byte view (0 for an empty one)."""
    if mv.nbytes == 0:
        return 0
    if not mv.readonly:  # several times cheaper than through numpy; this runs on every call
        return ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data)


def view_at(addr: int, length: int) -> memoryview:
    """A writable byte view of raw memory at `addr` (the caller vouches it is mapped)."""
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


@dataclass(slots=True)
class _Entry:
    region: MemoryRegion
    keepalive: object
    reserving: bool
    pin: memoryview | None = None
    """One more export of the whole exporter of a pinned registration (module docstring)."""


_PINNABLE = (bytearray, mmap.mmap, np.ndarray)
"""Exporters whose buffer stays where it is while exported (resizing refuses then)."""


def _pin(keepalive: object, region: MemoryRegion) -> memoryview | None:
    """An export of the whole exporter behind `keepalive` when that lies inside `region`."""
    if type(keepalive) is not memoryview:
        return None
    exporter = keepalive.obj
    if not isinstance(exporter, _PINNABLE):
        return None
    try:
        whole = byte_view(exporter)
    except (InvalidParams, ValueError, BufferError):
        return None
    if not whole.nbytes or not region.contains(buffer_address(whole), whole.nbytes):
        whole.release()
        return None
    return whole


class MemoryRegistry:
    """The registered memory of one engine, shared by all its transports."""

    def __init__(self, transports: Sequence[Transport]) -> None:
        self._transports = list(transports)
        self._lock = threading.Lock()
        self._starts: list[int] = []  # sorted start addresses of registered + reserving entries
        self._entries: dict[int, _Entry] = {}
        #: id of a pinned exporter -> its region (module docstring); changed under the lock,
        #: read without it (one dict lookup).
        self.pinned: dict[int, MemoryRegion] = {}

    # ---- queries -------------------------------------------------------------------------

    def regions(self) -> list[MemoryRegion]:
        """Registered (not reserving) regions, by address."""
        with self._lock:
            return [self._entries[a].region for a in self._starts if not self._entries[a].reserving]

    def find(self, addr: int, length: int) -> MemoryRegion | None:
        """The registered region containing [addr, addr+length), if any."""
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            if i < 0:
                return None
            e = self._entries[self._starts[i]]
            if e.reserving or not e.region.contains(addr, length):
                return None
            return e.region

    # ---- register ------------------------------------------------------------------------

    def register(self, buffer: object, length: int | None = None) -> MemoryRegion:
        """Register a buffer (or a raw address with `length`); returns its region."""
        return self.register_many([(buffer, length)])[0]

    def register_many(self, items: Sequence[tuple[object, int | None]]) -> list[MemoryRegion]:
        """Register several ranges, all or nothing; returns regions in the order given."""
        prepared = [self._prepare(buf, length) for buf, length in items]
        order = sorted(range(len(prepared)), key=lambda i: prepared[i][0].addr)
        for a, b in itertools.pairwise(order):
            ra, rb = prepared[a][0], prepared[b][0]
            if rb.addr < ra.end:
                raise AddressOverlapped(
                    f"ranges {ra.addr:#x}+{ra.length} and {rb.addr:#x}+{rb.length} overlap"
                )
        with self._lock:
            for region, _ in prepared:
                self._check_free(region)
            for region, keep in prepared:
                self._insert(_Entry(region, keep, reserving=True))
        done: list[tuple[Transport, MemoryRegion]] = []
        try:
            for transport in self._transports:
                for region, _ in prepared:
                    transport.register_memory(region)
                    done.append((transport, region))
        except BaseException:
            for transport, region in reversed(done):
                # Rollback is best effort; the original error is the one raised.
                with contextlib.suppress(Exception):
                    transport.unregister_memory(region)
            with self._lock:
                for region, _ in prepared:
                    self._remove(region.addr)
            raise
        with self._lock:
            for region, keep in prepared:
                entry = self._entries[region.addr]
                entry.reserving = False
                entry.pin = _pin(keep, region)
                if entry.pin is not None:
                    self.pinned[id(entry.pin.obj)] = region
        return [region for region, _ in prepared]

    def unregister(self, buffer: object) -> None:
        """Deregister the region starting at `buffer`'s address (or the int address given)."""
        addr = buffer if isinstance(buffer, int) else self._prepare(buffer, None)[0].addr
        with self._lock:
            entry = self._entries.get(addr)
            if entry is None or entry.reserving:
                raise InvalidParams(f"no registered region starts at {addr:#x}")
        first: KVPoolError | None = None
        for transport in self._transports:
            try:
                transport.unregister_memory(entry.region)
            except KVPoolError as exc:
                first = first or exc
        if first is not None:
            raise first
        with self._lock:
            self._remove(addr)

    # ---- internals -----------------------------------------------------------------------

    @staticmethod
    def _prepare(buffer: object, length: int | None) -> tuple[MemoryRegion, object]:
        if isinstance(buffer, bool):
            raise InvalidParams("register: expected a buffer or an address, got a bool")
        if isinstance(buffer, int):
            if length is None or length <= 0:
                raise InvalidParams(f"register: address {buffer:#x} needs a length > 0")
            if buffer <= 0:
                raise InvalidParams(f"register: address {buffer:#x} is not valid")
            return MemoryRegion(buffer, int(length)), None
        mv = byte_view(buffer, what="register")
        n = mv.nbytes if length is None else length
        if n <= 0 or n > mv.nbytes:
            raise InvalidParams(f"register: length {n} outside 1..{mv.nbytes}")
        return MemoryRegion(buffer_address(mv), n), buffer

    def _check_free(self, region: MemoryRegion) -> None:
        i = bisect.bisect_left(self._starts, region.addr)
        for j in (i - 1, i):
            if 0 <= j < len(self._starts):
                other = self._entries[self._starts[j]].region
                if other.addr < region.end and region.addr < other.end:
                    raise AddressOverlapped(
                        f"{region.addr:#x}+{region.length} overlaps registered "
                        f"{other.addr:#x}+{other.length}"
                    )

    def _insert(self, entry: _Entry) -> None:
        bisect.insort(self._starts, entry.region.addr)
        self._entries[entry.region.addr] = entry

    def _remove(self, addr: int) -> None:
        entry = self._entries.pop(addr, None)
        if entry is not None:
            del self._starts[bisect.bisect_left(self._starts, addr)]
            if entry.pin is not None:
                self.pinned.pop(id(entry.pin.obj), None)
                entry.pin.release()
