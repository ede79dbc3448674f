"""kvpool.transfer: the data plane. Bytes move between a client's buffers and segment memory
of any node, never through the master. See README.md in this package for the strategies, the
TCP wire header, the lifecycle of segments and why nothing needs sweeping.

Public names (the contract in docs/architecture.md):

* `SegmentMemory.create(name, size)`: a pre-faulted memfd segment owned by this process.
* `TransferServer(host, port)`: serves this process's segments over TCP.
* `SegmentLocation`, `host_id()`: how a segment is reached.
* `TransferEngine(resolver, protocol)`: register/unregister, attach_local/detach_local,
  open_segment, hold_segment, forget, submit → `TransferFuture`, transfer, close.
"""

from kvpool.transfer.base import MemoryRegion, Transport
from kvpool.transfer.engine import Resolver, RouteKind, SegmentHold, TransferEngine
from kvpool.transfer.future import TransferFuture
from kvpool.transfer.hostid import host_id
from kvpool.transfer.location import SegmentLocation
from kvpool.transfer.memory import SegmentMemory, SharedMapping, quarantined_count
from kvpool.transfer.registration import AddressOverlapped
from kvpool.transfer.request import TransferOp, TransferRequest
from kvpool.transfer.server import TransferServer

__all__ = [
    "AddressOverlapped",
    "MemoryRegion",
    "Resolver",
    "RouteKind",
    "SegmentHold",
    "SegmentLocation",
    "SegmentMemory",
    "SharedMapping",
    "TransferEngine",
    "TransferFuture",
    "TransferOp",
    "TransferRequest",
    "TransferServer",
    "Transport",
    "host_id",
    "quarantined_count",
]
