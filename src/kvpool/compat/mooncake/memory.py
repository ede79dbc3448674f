"""Raw pointers made safe: the registry of memory a Mooncake program registered by address.

Mooncake's zero-copy API names memory by integer address (`register_buffer(ptr, size)`,
`put_from(key, ptr, size)`, `get_into(key, ptr, size)`, ...). Dereferencing an arbitrary integer
can crash the process or corrupt memory, so this module keeps the (address, size) ranges the
program registered and turns a pointer into a memoryview only when the whole range
`[ptr, ptr + size)` lies inside one of them. Anything else is INVALID_PARAMS, and the address
is never touched. The registry holds one ctypes view per registration (made when the program
vouched for the memory by registering it); every resolved pointer is a slice of that view.

The program keeps the memory alive until it unregisters it, exactly as with Mooncake.

`BufferHandle` is what `get_buffer` returns: the value's bytes with Mooncake's handle methods.
`MooncakeHostMemAllocator` hands out page-aligned host memory by address (SGLang allocates its
host KV pool with it, then registers that memory).
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import operator
import threading
from dataclasses import dataclass

from kvpool.errors import InvalidParams

__all__ = ["BufferHandle", "MooncakeHostMemAllocator", "PointerRegistry", "Registration"]


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered range and the writable byte view over it."""

    address: int
    size: int
    view: memoryview


class PointerRegistry:
    """Registered ranges, sorted by address, never overlapping. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._regs: dict[int, Registration] = {}

    def add(self, address: int, size: int) -> Registration:
        """Record `[address, address + size)`; INVALID_PARAMS when empty or overlapping (as
        Mooncake's transfer engine: "does not support overlapped memory region")."""
        address, size = operator.index(address), operator.index(size)
        if address <= 0 or size <= 0:
            raise InvalidParams(f"register_buffer: bad range {address:#x} + {size}")
        with self._lock:
            i = bisect.bisect_right(self._starts, address)
            if i > 0:
                prev = self._regs[self._starts[i - 1]]
                if prev.address + prev.size > address:
                    raise InvalidParams(f"register_buffer: {address:#x} overlaps a registration")
            if i < len(self._starts) and self._starts[i] < address + size:
                raise InvalidParams(f"register_buffer: {address:#x} overlaps a registration")
            # The caller vouches for this memory by registering it: the only ctypes view made.
            view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
            reg = Registration(address, size, view)
            self._starts.insert(i, address)
            self._regs[address] = reg
            return reg

    def remove(self, address: int) -> Registration:
        """Forget the registration that starts at `address` (INVALID_PARAMS if none does)."""
        address = operator.index(address)
        with self._lock:
            reg = self._regs.pop(address, None)
            if reg is None:
                raise InvalidParams(f"unregister_buffer: nothing is registered at {address:#x}")
            self._starts.remove(address)
            return reg

    def resolve(self, address: int, size: int) -> memoryview:
        """A view of `[address, address + size)` if it lies inside one registration; else
        INVALID_PARAMS (the address is not dereferenced)."""
        address, size = operator.index(address), operator.index(size)
        if size <= 0:
            raise InvalidParams(f"buffer of {size} bytes at {address:#x}")
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            reg = self._regs[self._starts[i]] if i >= 0 else None
        if reg is None or address + size > reg.address + reg.size:
            raise InvalidParams(
                f"{size} bytes at {address:#x} are not inside memory registered with "
                "register_buffer()"
            )
        start = address - reg.address
        return reg.view[start : start + size]

    def find(self, address: int, size: int) -> memoryview | None:
        """`resolve`, or None instead of the error."""
        try:
            return self.resolve(address, size)
        except InvalidParams:
            return None

    def clear(self) -> list[Registration]:
        """Forget every registration; returns them."""
        with self._lock:
            regs = list(self._regs.values())
            self._regs.clear()
            self._starts.clear()
        return regs

    def __len__(self) -> int:
        return len(self._regs)


class BufferHandle(bytearray):
    """An object's bytes as Mooncake's `get_buffer` hands them out.

    Supports the buffer protocol and `len()`, plus Mooncake's `ptr()` (the address of the
    first byte) and `size()`. It owns its memory, so it stays valid as long as it is referenced.
    """

    def ptr(self) -> int:
        """Address of the first byte (stable: the handle is never resized)."""
        if not self:
            return 0
        return ctypes.addressof(ctypes.c_char.from_buffer(self))

    def size(self) -> int:
        return len(self)


class MooncakeHostMemAllocator:
    """Page-aligned host memory by address: `alloc(size) -> address`, `free(address) -> 0`.

    Each block is an anonymous mapping owned by this allocator: it stays mapped until `free`
    or until the allocator itself is dropped, so keep the allocator as long as the memory is
    used (as with Mooncake's). `alloc` answers 0 when the size is not positive or the mapping
    fails; `free` answers -600 for an address it did not hand out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # address -> (mapping, the ctypes view that pins it while the address is handed out)
        self._blocks: dict[int, tuple[mmap.mmap, ctypes.c_char]] = {}

    def alloc(self, size: int) -> int:
        n = operator.index(size)
        if n <= 0:
            return 0
        try:
            block = mmap.mmap(-1, n)
        except OSError:
            return 0
        pin = ctypes.c_char.from_buffer(block)
        address = ctypes.addressof(pin)
        with self._lock:
            self._blocks[address] = (block, pin)
        return address

    def free(self, ptr: int) -> int:
        with self._lock:
            entry = self._blocks.pop(operator.index(ptr), None)
        if entry is None:
            return int(InvalidParams.default_code)
        block, pin = entry
        del entry, pin  # the ctypes export must go before the mapping can be closed
        block.close()
        return 0
