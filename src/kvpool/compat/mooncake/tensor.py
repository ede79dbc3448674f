"""Mooncake's tensor objects: the format, so tensors written by one are readable by the other,
and the store's tensor calls (`TensorCalls`).

Mooncake stores a tensor as one object: a 304-byte `TensorMetadata` (little-endian, packed C
structs, as Mooncake's C++ tensor headers define them) followed by the tensor's bytes::

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
header functions here and `put_tensor_from` need nothing.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from kvpool.client import Store
from kvpool.codes import INVALID_PARAMS, OK
from kvpool.compat.mooncake.base import StoreBase
from kvpool.compat.mooncake.calls import (
    answers,
    as_code,
    check_key,
    check_keys,
    index,
    join_parts,
    one_code,
    per_key,
)
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.errors import InvalidParams

__all__ = [
    "DTYPE_CODES",
    "HEADER_SIZE",
    "MAGIC",
    "TensorCalls",
    "TensorHeader",
    "bytes_to_tensor",
    "deserialize_tensor",
    "encode_header",
    "encode_shard_header",
    "encode_tp_shard_header",
    "parse_header",
    "serialize_tensor",
    "shard_axes",
    "tensor_metadata_size",
    "tensor_to_parts",
]

log = logging.getLogger(__name__)

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


AXIS_TP = 1
"""Mooncake's LayoutAxisKind.TP (DP 0, TP 1, EP 2, PP 3)."""


def encode_tp_shard_header(  # noqa: PLR0917  (Mooncake's positional signature)
    dtype: str,
    global_shape: tuple[int, ...],
    local_shape: tuple[int, ...],
    rank: int,
    count: int,
    split_dim: int,
    data_bytes: int,
) -> bytes:
    """The 304-byte header of one tensor-parallel shard (SHARD layout, one TP axis), as
    Mooncake's `put_tensor_with_tp` writes it: the whole tensor's shape, the shard's shape,
    and the axis (rank of count along split_dim; its last field the shard's extent there)."""
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype {dtype!r} has no Mooncake code")
    ndim = len(global_shape)
    if ndim > MAX_DIMS or len(local_shape) != ndim:
        raise ValueError(f"shapes {global_shape} / {local_shape}: at most {MAX_DIMS} dims, equal")
    pad = [-1] * (MAX_DIMS - ndim)
    head = _HEAD.pack(
        MAGIC, VERSION, HEADER_SIZE, DTYPE_CODES[dtype], ndim, LAYOUT_SHARD, 0,
        HEADER_SIZE, data_bytes,
    )  # fmt: skip
    axis = _AXIS.pack(AXIS_TP, 0, rank, count, split_dim, 0, local_shape[split_dim])
    return (
        head
        + _SHAPE.pack(*global_shape, *pad)
        + _SHAPE.pack(*local_shape, *pad)
        + _AXES.pack(1, 0)
        + axis
        + bytes((MAX_AXES - 1) * _AXIS.size)
    )


def encode_shard_header(
    dtype: str,
    global_shape: tuple[int, ...],
    local_shape: tuple[int, ...],
    axes: list[tuple[int, int, int, int, int]],
    data_bytes: int,
) -> bytes:
    """The 304-byte header of a shard described by several parallel axes (SHARD layout), as
    Mooncake's `put_tensor_with_parallelism` writes it: per axis (kind, rank, count,
    split_dim or -1, expert/stage id or 0), in the order given; each axis records its index
    and, for a TP axis, the shard's extent along its split dimension."""
    if dtype not in DTYPE_CODES:
        raise ValueError(f"dtype {dtype!r} has no Mooncake code")
    ndim = len(global_shape)
    if ndim > MAX_DIMS or len(local_shape) != ndim or not 0 < len(axes) <= MAX_AXES:
        raise ValueError(f"shapes {global_shape} / {local_shape} with {len(axes)} axes")
    pad = [-1] * (MAX_DIMS - ndim)
    head = _HEAD.pack(
        MAGIC, VERSION, HEADER_SIZE, DTYPE_CODES[dtype], ndim, LAYOUT_SHARD, 0,
        HEADER_SIZE, data_bytes,
    )  # fmt: skip
    packed = b"".join(
        _AXIS.pack(kind, i, rank, count, split, aux, local_shape[split] if kind == AXIS_TP else 0)
        for i, (kind, rank, count, split, aux) in enumerate(axes)
    )
    return (
        head
        + _SHAPE.pack(*global_shape, *pad)
        + _SHAPE.pack(*local_shape, *pad)
        + _AXES.pack(len(axes), 0)
        + packed
        + bytes((MAX_AXES - len(axes)) * _AXIS.size)
    )


def shard_axes(
    obj: bytes | bytearray | memoryview,
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """(global shape, [(kind, index, rank, count, split_dim, aux, extent), ...]) of a tensor
    object's header (call `parse_header` first)."""
    mv = memoryview(obj).cast("B")[:HEADER_SIZE]
    ndim = _HEAD.unpack_from(mv, 0)[4]
    gshape = _SHAPE.unpack_from(mv, _HEAD.size)[:ndim]
    (count, _r) = _AXES.unpack_from(mv, _HEAD.size + 2 * _SHAPE.size)
    base = _HEAD.size + 2 * _SHAPE.size + _AXES.size
    axes = [
        tuple(_AXIS.unpack_from(mv, base + a * _AXIS.size)) for a in range(min(count, MAX_AXES))
    ]
    return tuple(gshape), axes


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


def serialize_tensor(tensor: Any) -> tuple[bytes, int, int, Any]:
    """Mooncake's module function `_serialize_tensor`: (the 304-byte metadata, the address of
    the tensor's data, its size in bytes, the object owning that memory). ValueError for a
    tensor Mooncake cannot store."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    t = tensor.detach().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPE_CODES or t.dim() > MAX_DIMS:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    size = t.numel() * t.element_size()
    return encode_header(name, tuple(int(d) for d in t.shape), size), t.data_ptr(), size, t


def tensor_metadata_size() -> int:
    """Mooncake's `_tensor_metadata_size`: the bytes of a tensor object's header (304)."""
    return HEADER_SIZE


def deserialize_tensor(payload: bytes) -> Any:
    """Mooncake's `_deserialize_tensor`: the tensor of `[metadata][data]` bytes, in memory of
    its own; ValueError for bytes Mooncake would refuse."""
    tensor = bytes_to_tensor(bytearray(payload))
    if tensor is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return tensor


class TensorCalls(StoreBase):
    """The tensor calls of `MooncakeDistributedStore`: objects in the format above."""

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Store a torch tensor in Mooncake's tensor format (needs torch)."""
        return self._put_tensor(check_key(key), tensor, None, upsert=False)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        return self._put_tensor(check_key(key), tensor, None, upsert=True)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """put_tensor with a ReplicateConfig."""
        return self._put_tensor(check_key(key), tensor, config, upsert=False)

    def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_tensor(check_key(key), tensor, config, upsert=True)

    def _put_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None, *, upsert: bool
    ) -> int:
        try:
            header, data = tensor_to_parts(tensor)
        except (ImportError, TypeError, ValueError) as exc:
            log.error("put_tensor %r: %s", key, exc)
            return INVALID_PARAMS
        return self._put(key, join_parts((header, data)), config, upsert)

    def batch_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        """pub_tensor per key; one code per key."""
        ks = check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID_PARAMS] * len(ks)
        return [self.pub_tensor(k, t, config) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_upsert_pub_tensor(
        self, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]:
        ks = check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID_PARAMS] * len(ks)
        return [self.upsert_pub_tensor(k, t, config) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_put_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        ks = check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID_PARAMS] * len(ks)
        return [self.put_tensor(k, t) for k, t in zip(ks, tensors_list, strict=True)]

    def batch_upsert_tensor(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        ks = check_keys(keys)
        if len(ks) != len(tensors_list):
            return [INVALID_PARAMS] * len(ks)
        return [self.upsert_tensor(k, t) for k, t in zip(ks, tensors_list, strict=True)]

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under `key` (sharing the bytes read), or None."""
        k = check_key(key)
        store = self._store
        if store is None or not k:
            return None
        try:
            return bytes_to_tensor(store.get(k))
        except ImportError as exc:
            log.error("get_tensor needs torch: %s", exc)
            return None
        except Exception as exc:
            as_code(exc)  # logged when unexpected
            return None

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return [self.get_tensor(k) for k in check_keys(keys)]

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store registered bytes laid out as [TensorMetadata][data]; -600 when the header is
        not one Mooncake accepts. Needs no torch."""
        return self._tensor_from(check_key(key), index(buffer_ptr), index(size), False)

    def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._tensor_from(check_key(key), index(buffer_ptr), index(size), True)

    @answers(one_code)
    def _tensor_from(self, store: Store, key: str, ptr: int, size: int, upsert: bool) -> int:
        mv = self._pointers.resolve(ptr, size)
        if parse_header(mv) is None:
            raise InvalidParams(f"{key!r}: not a valid Mooncake tensor object")
        if upsert:
            store.upsert(key, mv)
        else:
            store.put_from(key, mv)
        return OK

    def batch_put_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        ks = check_keys(keys)
        ptrs, ns = [index(p) for p in buffer_ptrs], [index(s) for s in sizes]
        return self._batch_tensor_from(ks, ptrs, ns, False)

    def batch_upsert_tensor_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        ks = check_keys(keys)
        ptrs, ns = [index(p) for p in buffer_ptrs], [index(s) for s in sizes]
        return self._batch_tensor_from(ks, ptrs, ns, True)

    @answers(per_key)
    def _batch_tensor_from(
        self, store: Store, keys: list[str], ptrs: list[int], sizes: list[int], upsert: bool
    ) -> list[int]:
        if not len(keys) == len(ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(keys)
        views = [self._pointers.find(p, n) for p, n in zip(ptrs, sizes, strict=True)]
        # As the wheel: one unreadable object fails the whole batch, before any write.
        if any(v is None or parse_header(v) is None for v in views):
            return [INVALID_PARAMS] * len(keys)
        return self._write_resolved(store, keys, views, None, upsert=upsert)

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read a tensor object into registered memory; the tensor viewing it, or None."""
        ptr, n = index(buffer_ptr), index(size)
        got = self._get_into(check_key(key), ptr, n)
        if got < 0:
            return None
        try:
            return bytes_to_tensor(self._pointers.resolve(ptr, got))
        except Exception as exc:
            log.error("get_tensor_into %r: %s", key, exc)
            return None

    def batch_get_tensor_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[Any]:
        ks = check_keys(keys)
        if not len(ks) == len(buffer_ptrs) == len(sizes):
            return [None] * len(ks)
        return [
            self.get_tensor_into(k, p, n) for k, p, n in zip(ks, buffer_ptrs, sizes, strict=True)
        ]
