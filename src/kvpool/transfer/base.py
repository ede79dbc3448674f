"""`Transport`: the narrow contract every data-plane transport implements.

The engine owns a list of transports (shm/memcpy and TCP today; RDMA or NIXL later, behind the
same seam). A transport takes part in memory registration, so a transport that must pin or
register memory with hardware (RDMA) can do it; the built-in ones need not: memcpy and sockets
reach any mapped memory.

Threading: `register_memory` / `unregister_memory` are called by the engine's registry under
its registration lock, from the caller's thread; they may block (an RDMA registration does).
Failure: raise a `KVPoolError`; the registry rolls back the transports already done, in
reverse order. `unregister_memory` of a region this transport never registered is a no-op.
`close()` is idempotent and releases every thread, socket and mapping the transport holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

__all__ = ["MemoryRegion", "Transport"]


@dataclass(frozen=True, slots=True)
class MemoryRegion:
    """A registered range of this process's memory: [addr, addr + length)."""

    addr: int
    length: int

    @property
    def end(self) -> int:
        return self.addr + self.length

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.end


class Transport(ABC):
    """One way of moving bytes; see the module docstring for the contract."""

    name: str = "transport"

    @abstractmethod
    def register_memory(self, region: MemoryRegion) -> None:
        """Make `region` usable by this transport (pin it, register it with a NIC, ...)."""

    @abstractmethod
    def unregister_memory(self, region: MemoryRegion) -> None:
        """Undo `register_memory`; must not fail for a region it does not know."""

    @abstractmethod
    def close(self) -> None:
        """Release everything the transport holds; idempotent."""
