"""Mooncake's tensor object format, so tensors written by one are readable by the other.

Mooncake stores a tensor as one object: a 304-byte `TensorMetadata` (little-endian, packed C
structs, mooncake-integration/store tensor headers) followed by the tensor's bytes::

    TensorObjectHeader (40 bytes)
        u32 magic = 0x4d4f4f4e ("NOOM")   u16 version = 1   u16 header_size = 304
        i32 dtype (TensorDtype)            i32 ndim (<= 8)
        u32 layout_kind (0 FULL, 1 SHARD)  u32 reserved_flags
        u64 data_offset (>= 304)           u64 data_bytes (= object size - data_offset)
    TensorLayoutMetadata (264 bytes)
        i64 global_shape[8]   i64 local_shape[8]   (unused dims are -1)
        u32 axis_count (<= 4)  u32 reserved
        LayoutAxis axes[4]: i32 kind, axis_index, shard_rank, shard_count, split_dim,
                            reserved0; i64 reserved1   (32 bytes each)

`put_tensor_from` on the real wheel accepts exactly the objects `parse_header` accepts and
refuses a zeroed or size-inconsistent header with -600 (checked against the wheel).

Writing and reading `torch.Tensor`s needs torch, imported only when a tensor call is made; the
header functions here need nothing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DTYPE_CODES",
    "HEADER_SIZE",
    "MAGIC",
    "TensorHeader",
    "bytes_to_tensor",
    "encode_header",
    "parse_header",
    "tensor_to_parts",
]

MAGIC = 0x4D4F4F4E
VERSION = 1
HEADER_SIZE = 304
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL = 0
LAYOUT_SHARD = 1

_HEAD = struct.Struct("<IHHiiIIQQ")  # 40 bytes
_SHAPE = struct.Struct(f"<{MAX_DIMS}q")  # 64 bytes
_AXES = struct.Struct("<II")
_AXIS = struct.Struct("<iiiiiiq")  # 32 bytes
assert _HEAD.size + 2 * _SHAPE.size + _AXES.size + MAX_AXES * _AXIS.size == HEADER_SIZE

DTYPE_CODES: dict[str, int] = {
    "float32": 0,
    "float64": 1,
    "int8": 2,
    "uint8": 3,
    "int16": 4,
    "uint16": 5,
    "int32": 6,
    "uint32": 7,
    "int64": 8,
    "uint64": 9,
    "bool": 10,
    "float16": 11,
    "bfloat16": 12,
    "float8_e4m3fn": 13,
    "float8_e5m2": 14,
}
"""torch dtype name → Mooncake's TensorDtype number."""
_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


@dataclass(frozen=True, slots=True)
class TensorHeader:
    """What `parse_header` read: the dtype name, the shape, and where the data lies."""

    dtype: str
    shape: tuple[int, ...]
    data_offset: int
    data_bytes: int


def encode_header(dtype: str, shape: tuple[int, ...], data_bytes: int) -> bytes:
    """The 304-byte header of a whole (FULL layout) tensor."""
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype {dtype!r} has no Mooncake code")
    if len(shape) > MAX_DIMS:
        raise ValueError(f"{len(shape)} dimensions; Mooncake stores at most {MAX_DIMS}")
    dims = [*shape, *([-1] * (MAX_DIMS - len(shape)))]
    head = _HEAD.pack(
        MAGIC, VERSION, HEADER_SIZE, DTYPE_CODES[dtype], len(shape), LAYOUT_FULL, 0,
        HEADER_SIZE, data_bytes,
    )  # fmt: skip
    return (
        head
        + _SHAPE.pack(*dims)
        + _SHAPE.pack(*dims)
        + _AXES.pack(0, 0)
        + bytes(MAX_AXES * _AXIS.size)
    )


def parse_header(obj: bytes | bytearray | memoryview) -> TensorHeader | None:
    """The header of a tensor object of `len(obj)` bytes, or None when Mooncake would refuse
    it (the checks of Mooncake's ValidateTensorMetadata)."""
    total = len(obj)
    if total < HEADER_SIZE:
        return None
    mv = memoryview(obj).cast("B")[:HEADER_SIZE]
    magic, version, hsize, dtype, ndim, layout, _flags, off, nbytes = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION or hsize != HEADER_SIZE:
        return None
    if dtype not in _DTYPE_NAMES or not 0 <= ndim <= MAX_DIMS or layout > LAYOUT_SHARD:
        return None
    if not HEADER_SIZE <= off <= total or nbytes != total - off:
        return None
    gshape = _SHAPE.unpack_from(mv, _HEAD.size)
    lshape = _SHAPE.unpack_from(mv, _HEAD.size + _SHAPE.size)
    (axis_count, _reserved) = _AXES.unpack_from(mv, _HEAD.size + 2 * _SHAPE.size)
    if axis_count > MAX_AXES:
        return None
    if any(gshape[i] <= 0 or lshape[i] < 0 for i in range(ndim)):
        return None
    if any(gshape[i] != -1 or lshape[i] != -1 for i in range(ndim, MAX_DIMS)):
        return None
    base = _HEAD.size + 2 * _SHAPE.size + _AXES.size
    for a in range(axis_count):
        kind, _idx, rank, count, split, _r0, _r1 = _AXIS.unpack_from(mv, base + a * _AXIS.size)
        if not 0 <= kind <= 4 or count <= 0 or not 0 <= rank < count:
            return None
        if not -1 <= split < ndim:
            return None
    # A shard's data has the local shape; a whole tensor's local shape equals its global one.
    shape = tuple(lshape[:ndim]) if layout == LAYOUT_SHARD else tuple(gshape[:ndim])
    return TensorHeader(_DTYPE_NAMES[dtype], shape, off, nbytes)


def _torch() -> Any:
    import torch  # optional: only the tensor calls need it

    return torch


def tensor_to_parts(tensor: Any) -> tuple[bytes, memoryview]:
    """(header, data) of a torch tensor, data as the bytes of its contiguous CPU copy."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    name = str(tensor.dtype).removeprefix("torch.")
    t = tensor.detach().to("cpu").contiguous()
    # Viewing as bytes works for every dtype, including those numpy lacks (bfloat16, float8).
    data = t.reshape(-1).view(torch.uint8).numpy()
    return encode_header(name, tuple(int(d) for d in t.shape), data.nbytes), memoryview(data)


def bytes_to_tensor(obj: bytearray | memoryview) -> Any:
    """The tensor a Mooncake tensor object holds (sharing `obj`'s memory), or None."""
    header = parse_header(obj)
    if header is None:
        return None
    torch = _torch()
    dtype = getattr(torch, header.dtype)
    data = memoryview(obj).cast("B")[header.data_offset : header.data_offset + header.data_bytes]
    flat = torch.frombuffer(data, dtype=torch.uint8) if header.data_bytes else torch.empty(0)
    return flat.view(dtype).reshape(header.shape)
