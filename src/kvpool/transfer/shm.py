"""The shared-memory transport: memcpy into a local segment or a same-host peer's mapping.

The copying itself is inline in `TransferEngine` (it is a slice assignment, or a numpy copy
that releases the GIL in the memcpy pool), and the mappings are `SharedMapping`s owned by the
engine's routes. What remains here is the `Transport` seam: memcpy needs no registration, but
the transport takes part in it like any other so the registry's rules hold for every transport.
"""

from __future__ import annotations

from kvpool.override import override
from kvpool.transfer.base import MemoryRegion, Transport

__all__ = ["ShmTransport"]


class ShmTransport(Transport):
    """memcpy between this process's memory and mapped segment memory."""

    name = "shm"

    @override
    def register_memory(self, region: MemoryRegion) -> None:
        """Nothing to pin: memcpy reaches any mapped memory of this process."""

    @override
    def unregister_memory(self, region: MemoryRegion) -> None:
        """Nothing was pinned."""

    @override
    def close(self) -> None:
        """Holds nothing: the engine owns the mappings."""
