"""Memory objects of L1: one KV chunk's bytes, with the layout that says how to view them.

A `MemoryObj` owns one contiguous, writable, C-ordered numpy byte array. Adapters read and
write it through `.buffer` (a memoryview, so sockets, files and hashes take it without a copy);
the engine views it as typed arrays with `.arrays()` or, when torch is installed, as tensors
with `.tensors()` (`torch.frombuffer` over the same memory: no copy). The L1 manager owns every
MemoryObj; nobody else allocates them, so the L1 capacity accounting is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvpool.cache.keys import ObjectKey
from kvpool.errors import InvalidParams

__all__ = ["MemoryLayout", "MemoryObj"]


@dataclass(frozen=True, slots=True)
class MemoryLayout:
    """Shapes and dtypes (numpy names, e.g. "float16") of the arrays one chunk holds, in order."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.shapes or len(self.shapes) != len(self.dtypes):
            raise InvalidParams(
                f"MemoryLayout needs one dtype per shape (at least one), got {len(self.shapes)} "
                f"shapes and {len(self.dtypes)} dtypes"
            )
        for shape in self.shapes:
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
                raise InvalidParams(f"MemoryLayout shape {shape!r} must hold ints >= 0")
        for dt in self.dtypes:
            try:
                np.dtype(dt)
            except TypeError as exc:
                raise InvalidParams(f"MemoryLayout dtype {dt!r} is not a numpy dtype") from exc
        if self.nbytes == 0:
            raise InvalidParams("MemoryLayout describes zero bytes")

    @classmethod
    def of_bytes(cls, nbytes: int) -> MemoryLayout:
        """A layout of one flat uint8 array of `nbytes` bytes (values that are just bytes)."""
        return cls(((nbytes,),), ("uint8",))

    @property
    def nbytes(self) -> int:
        return sum(
            math.prod(shape) * np.dtype(dt).itemsize
            for shape, dt in zip(self.shapes, self.dtypes, strict=True)
        )


class MemoryObj:
    """One chunk's bytes in L1. Created only by the L1 manager."""

    __slots__ = ("_array", "key", "layout")

    def __init__(
        self,
        key: ObjectKey,
        layout: MemoryLayout,
        array: np.ndarray[Any, np.dtype[np.uint8]] | None = None,
    ) -> None:
        self.key = key
        self.layout = layout
        if array is None:
            array = np.empty(layout.nbytes, dtype=np.uint8)
        elif array.dtype != np.uint8 or array.ndim != 1 or array.nbytes != layout.nbytes:
            raise InvalidParams(f"MemoryObj needs a flat uint8 array of {layout.nbytes} bytes")
        self._array: np.ndarray[Any, np.dtype[np.uint8]] = array

    @property
    def size(self) -> int:
        return int(self._array.nbytes)

    @property
    def buffer(self) -> memoryview:
        """The object's bytes, writable, format "B"."""
        return self._array.data.cast("B")

    @property
    def array(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        return self._array

    def arrays(self) -> list[np.ndarray[Any, Any]]:
        """Typed views (no copies) of the arrays the layout describes."""
        out: list[np.ndarray[Any, Any]] = []
        offset = 0
        for shape, dt in zip(self.layout.shapes, self.layout.dtypes, strict=True):
            n = math.prod(shape) * np.dtype(dt).itemsize
            out.append(self._array[offset : offset + n].view(dt).reshape(shape))
            offset += n
        return out

    def tensors(self) -> list[Any]:
        """torch tensors over the same memory (needs torch; no copy)."""
        import torch

        out: list[Any] = []
        for view, dt in zip(self.arrays(), self.layout.dtypes, strict=True):
            flat = torch.frombuffer(view.reshape(-1).data.cast("B"), dtype=torch.uint8)
            out.append(flat.view(getattr(torch, np.dtype(dt).name)).reshape(view.shape))
        return out

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Copy `data` (exactly `size` bytes) into the object."""
        view = memoryview(data).cast("B")
        if view.nbytes != self.size:
            raise InvalidParams(
                f"write of {view.nbytes} bytes into a {self.size}-byte object {self.key}"
            )
        self._array[:] = np.frombuffer(view, dtype=np.uint8)

    def __repr__(self) -> str:
        return f"MemoryObj({self.key}, {self.size} B)"
