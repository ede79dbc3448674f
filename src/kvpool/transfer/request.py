"""What a caller asks the engine to move: `TransferOp` and `TransferRequest`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["TransferOp", "TransferRequest"]


class TransferOp(IntEnum):
    """Direction, seen from the caller: READ copies segment → buffer, WRITE buffer → segment.

    The values are the op byte of the TCP wire header.
    """

    READ = 1
    WRITE = 2


@dataclass(frozen=True, slots=True)
class TransferRequest:
    """Move `length` bytes between `buffer` and `segment` at `offset`.

    `buffer` is anything with the buffer protocol (bytearray, memoryview, mmap, numpy array),
    or an int address inside memory registered with the engine (then `length` is required).
    `length` defaults to the whole buffer.
    """

    op: TransferOp
    buffer: object
    segment: str
    offset: int
    length: int | None = None
