"""Mooncake's parallelism descriptors and the `*_tensor_with_parallelism*` calls.

`ParallelAxis` (kind "tp" / "dp" / "ep" / "pp", rank, size, split_dim, expert_id, stage_id),
`TensorParallelism` (its `axes`) and `ReadTarget` (mode "as_stored" / "full" / "shard", and a
`parallelism`) are the wheel's descriptor classes (0.3.13), with its defaults. The calls store
and read objects byte for byte as the wheel does (checked against it, tests/compat/
test_tensor_parallel.py):

* No parallelism: the tensor is one FULL object under `key` (`pub_tensor`).
* One TP axis (rank r of n, split_dim d): the tensor is rank r's shard; stored as
  `<key>_tp_<r>` (the `*_with_tp` objects) with the whole shape inferred (n times the shard
  along d), plus a manifest `<key>__parallelism_manifest` (96 bytes: magic "NAMW", the
  dtype, the number of dimensions, d, n, the whole shape).
* Several axes, or one that is not TP: the tensor is the whole tensor, and the shard the TP
  axis (if any) selects is stored as `<key>__<kind>_<rank>of<size>[_sd<d>][_eid<e>]
  [_sid<s>]...`, axes named in the order DP, TP, EP, PP; its header lists the axes in the
  order given. With a TP axis, the manifest too.
* The `_from` forms take the whole tensor from registered `[TensorMetadata][data]` bytes and
  store the shard the parallelism selects (also for one TP axis).

Reads (`ReadTarget`): no target, or "as_stored" without a parallelism, read the FULL object;
"as_stored" with one answers None (the wheel's "unsupported mode"); "full" with a parallelism
joins the TP shards named by the manifest (or by shard 0's header); "shard" with one TP axis
reads the part of the whole tensor that rank r of m owns (resharding from however many shards
were stored), and any other target reads the object its name names. When resharding is not
possible (another split dimension, a dimension that does not divide evenly) the wheel reads
`<key>_tp_<r>` as stored, and so does this.

A `writer_partition` (an object with `rank`, `size`, `split_dim`; not with a parallelism)
stores part `rank` of `size` of the whole tensor along `split_dim` as
`<key>__writer_<rank>of<size>_sd<d>` (one TP axis in its header) with a manifest
`<key>__writer_manifest`; "full" without a parallelism joins the parts when there is no FULL
object, and "shard" with one TP axis of the same count and split dimension reads a part.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Final

from kvpool.codes import INVALID_PARAMS, OK
from kvpool.compat.mooncake.calls import check_key, check_keys, index, join_parts
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.compat.mooncake.tensor import (
    AXIS_TP,
    DTYPE_CODES,
    HEADER_SIZE,
    _torch,
    bytes_to_tensor,
    encode_header,
    encode_shard_header,
    parse_header,
    shard_axes,
)
from kvpool.compat.mooncake.tensor_tp import TensorTpCalls

__all__ = ["ParallelAxis", "ReadTarget", "TensorParallelCalls", "TensorParallelism", "key_name"]

log = logging.getLogger(__name__)

KINDS: Final = {"dp": 0, "tp": AXIS_TP, "ep": 2, "pp": 3}
"""Mooncake's LayoutAxisKind numbers; also the order axes are named in."""
MODES: Final = ("as_stored", "full", "shard")
_MANIFEST = struct.Struct("<IHHIIiIII8q")
_MANIFEST_MAGIC = 0x574D414E  # "NAMW"
assert _MANIFEST.size == 96


@dataclass(slots=True)
class ParallelAxis:
    """One axis of a tensor's parallel layout (the wheel's attributes and defaults)."""

    kind: str = ""
    """"tp", "dp", "ep" or "pp" (any case); the wheel leaves it empty until set."""
    rank: int = 0
    size: int = 1
    split_dim: int | None = None
    expert_id: int | None = None
    stage_id: int | None = None


@dataclass(slots=True)
class TensorParallelism:
    """The axes of a tensor's parallel layout."""

    axes: list[ParallelAxis] = field(default_factory=list)


class ReadTarget:
    """What a read asks for: the object as stored, the whole tensor, or a shard. Setting a
    mode the wheel does not know raises RuntimeError, as its setter does."""

    __slots__ = ("_mode", "parallelism")

    def __init__(self) -> None:
        self._mode = "as_stored"
        self.parallelism: TensorParallelism | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = value


@dataclass(frozen=True, slots=True)
class _Axis:
    kind: int
    rank: int
    size: int
    split: int  # -1 when none
    aux: int  # expert_id (EP) or stage_id (PP), else 0
    name: str


def _axes(parallelism: object, ndim: int | None) -> list[_Axis] | None:
    """The validated axes of a TensorParallelism (None when invalid; logged)."""
    raw = getattr(parallelism, "axes", None)
    if not isinstance(raw, list) or not raw:
        log.error("parallelism: a TensorParallelism with at least one axis expected")
        return None
    out: list[_Axis] = []
    for a in raw:
        kind = str(getattr(a, "kind", "")).lower()
        rank, size = getattr(a, "rank", None), getattr(a, "size", None)
        split, eid, sid = (getattr(a, n, None) for n in ("split_dim", "expert_id", "stage_id"))
        if kind not in KINDS:
            log.error("Unsupported parallel axis kind: %s", kind)
            return None
        if not isinstance(rank, int) or not isinstance(size, int) or not 0 <= rank < size:
            log.error("parallelism: invalid rank/size for axis %s", kind)
            return None
        if kind == "tp" and (
            not isinstance(split, int) or split < 0 or (ndim is not None and split >= ndim)
        ):
            log.error("parallelism: TP axis requires a split_dim inside the tensor")
            return None
        name = f"{kind}_{rank}of{size}"
        for tag, v in (("sd", split), ("eid", eid), ("sid", sid)):
            if v is not None:
                name += f"_{tag}{int(v)}"
        aux = int(eid) if kind == "ep" and eid is not None else 0
        aux = int(sid) if kind == "pp" and sid is not None else aux
        tp_split = int(split) if kind == "tp" and split is not None else -1
        out.append(_Axis(KINDS[kind], rank, size, tp_split, aux, name))
    if sum(a.kind == AXIS_TP for a in out) > 1:
        log.error("parallelism: at most one TP axis")
        return None
    return out


def _tp_only(axes: list[_Axis]) -> bool:
    return len(axes) == 1 and axes[0].kind == AXIS_TP


def key_name(key: str, axes: list[_Axis]) -> str:
    """The object name of the shard `axes` describe (module docstring)."""
    if _tp_only(axes):
        return f"{key}_tp_{axes[0].rank}"
    ordered = sorted(axes, key=lambda a: a.kind)
    return key + "".join(f"__{a.name}" for a in ordered)


def _shard_name(key: str, axes: list[_Axis], rank: int) -> str:
    """The name of TP rank `rank`'s shard among `axes` (the other axes as they are)."""
    named = [
        a if a.kind != AXIS_TP
        else _Axis(a.kind, rank, a.size, a.split, a.aux, f"tp_{rank}of{a.size}_sd{a.split}")
        for a in axes
    ]  # fmt: skip
    return key_name(key, named)


def _writer(partition: object, ndim: int) -> _Axis | None:
    """The part a `writer_partition` (rank, size, split_dim attributes) names, as a TP axis."""
    rank, size, split = (getattr(partition, n, None) for n in ("rank", "size", "split_dim"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, size, split)):
        log.error("put_tensor_with_parallelism: writer_partition must provide rank, size, and "
                  "split_dim")  # fmt: skip
        return None
    assert isinstance(rank, int) and isinstance(size, int) and isinstance(split, int)
    if not 0 <= rank < size or not 0 <= split < ndim:
        log.error("put_tensor_with_parallelism: invalid writer partition")
        return None
    return _Axis(AXIS_TP, rank, size, split, 0, f"writer_{rank}of{size}_sd{split}")


def _writer_name(key: str, part: _Axis) -> str:
    return f"{key}__writer_{part.rank}of{part.size}_sd{part.split}"


def _writer_manifest_key(key: str) -> str:
    return f"{key}__writer_manifest"


def _manifest_key(key: str) -> str:
    return f"{key}__parallelism_manifest"


def _manifest(dtype: str, shape: tuple[int, ...], split: int, count: int) -> bytes:
    dims = [*shape, *([-1] * (8 - len(shape)))]
    return _MANIFEST.pack(
        _MANIFEST_MAGIC, 1, _MANIFEST.size, DTYPE_CODES[dtype], len(shape), split, count, 0, 0,
        *dims,
    )  # fmt: skip


def _read_manifest(raw: bytes) -> tuple[tuple[int, ...], int, int] | None:
    """(whole shape, split_dim, shard count) of a manifest, or None."""
    if len(raw) != _MANIFEST.size:
        return None
    magic, _v, _n, _dtype, ndim, split, count, *rest = _MANIFEST.unpack(raw)
    if magic != _MANIFEST_MAGIC or not 0 < ndim <= 8 or count <= 0:
        return None
    return tuple(rest[2 : 2 + ndim]), split, count


class TensorParallelCalls(TensorTpCalls):
    """The `*_tensor_with_parallelism*` calls (module docstring)."""

    # ------------------------------------------------------------------ writes

    def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Store `tensor` laid out as `parallelism` says; 0 or a negative code."""
        return self._put_par(check_key(key), tensor, parallelism, config, writer_partition,
                             upsert=False, whole=False)  # fmt: skip

    def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._put_par(check_key(key), tensor, parallelism, config, writer_partition,
                             upsert=True, whole=False)  # fmt: skip

    def put_tensor_with_parallelism_from(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """The whole tensor from registered `[TensorMetadata][data]` bytes; stores the shard
        `parallelism` selects."""
        return self._from_par(check_key(key), buffer_ptr, size, parallelism, config,
                              writer_partition, upsert=False)  # fmt: skip

    def upsert_tensor_with_parallelism_from(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        return self._from_par(check_key(key), buffer_ptr, size, parallelism, config,
                              writer_partition, upsert=True)  # fmt: skip

    def batch_put_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_put_par(keys, tensors_list, parallelisms, config, writer_partitions,
                                   upsert=False)  # fmt: skip

    def batch_upsert_tensor_with_parallelism(
        self,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_put_par(keys, tensors_list, parallelisms, config, writer_partitions,
                                   upsert=True)  # fmt: skip

    def batch_put_tensor_with_parallelism_from(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_from_par(keys, buffer_ptrs, sizes, parallelisms, config,
                                    writer_partitions, upsert=False)  # fmt: skip

    def batch_upsert_tensor_with_parallelism_from(  # noqa: PLR0917  (Mooncake's signature)
        self,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        return self._batch_from_par(keys, buffer_ptrs, sizes, parallelisms, config,
                                    writer_partitions, upsert=True)  # fmt: skip

    def _batch_put_par(
        self,
        keys: list[str],
        tensors: list[Any],
        parallelisms: Any,
        config: ReplicateConfig | None,
        writer_partitions: Any,
        *,
        upsert: bool,
    ) -> list[int]:
        ks = check_keys(keys)
        pars = [None] * len(ks) if parallelisms is None else list(parallelisms)
        wps = [None] * len(ks) if writer_partitions is None else list(writer_partitions)
        if not ks or not len(ks) == len(tensors) == len(pars) == len(wps):
            log.error(
                "batch_put_tensor_with_parallelism: values and keys must have the same length"
            )
            return [INVALID_PARAMS] * len(ks)
        if parallelisms is not None and writer_partitions is not None:
            log.error("writer_partitions cannot be combined with parallelisms")
            return [INVALID_PARAMS] * len(ks)
        return [
            self._put_par(k, t, p, config, w, upsert=upsert, whole=False)
            for k, t, p, w in zip(ks, tensors, pars, wps, strict=True)
        ]

    def _batch_from_par(  # noqa: PLR0917
        self,
        keys: list[str],
        ptrs: list[int],
        sizes: list[int],
        parallelisms: Any,
        config: ReplicateConfig | None,
        writer_partitions: Any,
        *,
        upsert: bool,
    ) -> list[int]:
        ks = check_keys(keys)
        if not ks:
            return []
        pars = [None] * len(ks) if parallelisms is None else list(parallelisms)
        wps = [None] * len(ks) if writer_partitions is None else list(writer_partitions)
        if not len(ks) == len(ptrs) == len(sizes) == len(pars) == len(wps):
            return [INVALID_PARAMS] * len(ks)
        if parallelisms is not None and writer_partitions is not None:
            log.error("writer_partitions cannot be combined with parallelisms")
            return [INVALID_PARAMS] * len(ks)
        return [
            self._from_par(k, p, n, par, config, w, upsert=upsert)
            for k, p, n, par, w in zip(ks, ptrs, sizes, pars, wps, strict=True)
        ]

    def _from_par(  # noqa: PLR0917
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any,
        config: ReplicateConfig | None,
        writer_partition: Any,
        *,
        upsert: bool,
    ) -> int:
        ptr, n = index(buffer_ptr), index(size)
        if self._store is None:
            return INVALID_PARAMS
        mv = self._pointers.find(ptr, n)
        tensor = None if mv is None or parse_header(mv) is None else bytes_to_tensor(mv)
        if tensor is None:
            log.error("put_tensor_with_parallelism_from %r: not a registered tensor object", key)
            return INVALID_PARAMS
        return self._put_par(key, tensor, parallelism, config, writer_partition,
                             upsert=upsert, whole=True)  # fmt: skip

    def _put_par(
        self,
        key: str,
        tensor: Any,
        parallelism: Any,
        config: ReplicateConfig | None,
        writer_partition: Any,
        *,
        upsert: bool,
        whole: bool,
    ) -> int:
        if writer_partition is not None and parallelism is not None:
            log.error("put_tensor_with_parallelism: writer_partition cannot be combined")
            return INVALID_PARAMS
        if parallelism is None and writer_partition is None:
            return self._put_tensor(key, tensor, config, upsert=upsert)
        try:
            torch = _torch()
        except ImportError as exc:
            log.error("put_tensor_with_parallelism needs torch: %s", exc)
            return INVALID_PARAMS
        if not isinstance(tensor, torch.Tensor):
            log.error("put_tensor_with_parallelism %r: not a torch.Tensor", key)
            return INVALID_PARAMS
        t = tensor.detach().to("cpu")
        dtype = str(t.dtype).removeprefix("torch.")
        if writer_partition is not None:
            writer = _writer(writer_partition, t.dim())
            axes = None if writer is None else [writer]
        else:
            axes = _axes(parallelism, t.dim())
        if axes is None or dtype not in DTYPE_CODES:
            return INVALID_PARAMS
        shape = tuple(int(d) for d in t.shape)
        tp = next((a for a in axes if a.kind == AXIS_TP), None)
        if tp is not None and _tp_only(axes) and not whole and writer_partition is None:
            local, full = t, list(shape)
            full[tp.split] *= tp.size
            global_shape = tuple(full)
        elif tp is not None:
            if shape[tp.split] % tp.size:
                log.error("put_tensor_with_parallelism %r: only uniform sharding", key)
                return INVALID_PARAMS
            extent = shape[tp.split] // tp.size
            local, global_shape = t.narrow(tp.split, tp.rank * extent, extent), shape
        else:
            local, global_shape = t, shape
        local = local.contiguous()
        data = local.reshape(-1).view(torch.uint8).numpy()
        local_shape = tuple(int(d) for d in local.shape)
        header = encode_shard_header(
            dtype, global_shape, local_shape,
            [(a.kind, a.rank, a.size, a.split, a.aux) for a in axes], data.nbytes,
        )  # fmt: skip
        if writer_partition is not None:
            name, manifest_key = _writer_name(key, axes[0]), _writer_manifest_key(key)
        else:
            name, manifest_key = key_name(key, axes), _manifest_key(key)
        code = self._put(name, join_parts((header, memoryview(data))), config, upsert)
        if code != OK or tp is None:
            return int(code)
        manifest = _manifest(dtype, global_shape, tp.split, tp.size)
        return int(self._put(manifest_key, memoryview(manifest), config, upsert))

    # ------------------------------------------------------------------ reads

    def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """The tensor `target` asks for (module docstring), or None."""
        return self._read_par(check_key(key), target)

    def batch_get_tensor_with_parallelism(self, keys: list[str], targets: Any = None) -> list[Any]:
        ks = check_keys(keys)
        ts = [None] * len(ks) if targets is None else list(targets)
        if len(ts) != len(ks):
            log.error(
                "batch_get_tensor_with_parallelism: keys and targets must have the same length"
            )
            return [None] * len(ks)
        return [self._read_par(k, t) for k, t in zip(ks, ts, strict=True)]

    def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any:
        """The tensor `target` asks for, written into registered memory as a tensor object;
        the tensor viewing it, or None (also when the buffer is too small)."""
        tensor = self._read_par(check_key(key), target)
        if tensor is None:
            return None
        return self._into(tensor, index(buffer_ptr), index(size))

    def batch_get_tensor_with_parallelism_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], targets: Any = None
    ) -> list[Any]:
        ks = check_keys(keys)
        ts = [None] * len(ks) if targets is None else list(targets)
        if not len(ks) == len(buffer_ptrs) == len(sizes) == len(ts):
            return [None] * len(ks)
        return [
            self.get_tensor_with_parallelism_into(k, p, n, t)
            for k, p, n, t in zip(ks, buffer_ptrs, sizes, ts, strict=True)
        ]

    def _into(self, tensor: Any, ptr: int, n: int) -> Any:
        torch = _torch()
        t = tensor.contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy()
        header = encode_header(str(t.dtype).removeprefix("torch."), tuple(t.shape), data.nbytes)
        mv = self._pointers.find(ptr, n)
        if mv is None or HEADER_SIZE + data.nbytes > n:
            log.error("get_tensor_with_parallelism_into: buffer too small for the tensor")
            return None
        out = mv.cast("B")
        out[:HEADER_SIZE] = header
        out[HEADER_SIZE : HEADER_SIZE + data.nbytes] = data.tobytes()
        return bytes_to_tensor(out[: HEADER_SIZE + data.nbytes])

    def _raw(self, name: str) -> bytes | None:
        store = self._store
        if store is None:
            return None
        try:
            return bytes(store.get(name))
        except Exception:
            return None

    def _read_par(self, key: str, target: Any) -> Any:
        mode = "as_stored" if target is None else str(getattr(target, "mode", ""))
        parallelism = None if target is None else getattr(target, "parallelism", None)
        if mode not in MODES:
            log.error("get_tensor_with_parallelism: unsupported ReadTarget mode %r", mode)
            return None
        if parallelism is None:
            if mode == "shard":
                return None
            whole = self.get_tensor(key)
            return self._join_writers(key) if whole is None and mode == "full" else whole
        if mode == "as_stored":
            log.error("get_tensor_with_parallelism: unsupported ReadTarget mode")
            return None
        axes = _axes(parallelism, None)
        if axes is None:
            return None
        if mode == "full":
            return self._join(key, axes)
        if _tp_only(axes):
            shard = self._reshard(key, axes[0])
            if shard is not None:
                return shard
        stored = self.get_tensor(key_name(key, axes))
        if stored is None and _tp_only(axes):
            return self._writer_part(key, axes[0])
        return stored

    def _writer_layout(self, key: str) -> tuple[tuple[int, ...], int, int] | None:
        raw = self._raw(_writer_manifest_key(key))
        return None if raw is None else _read_manifest(raw)

    def _join_writers(self, key: str) -> Any:
        layout = self._writer_layout(key)
        if layout is None:
            return None
        shape, split, count = layout
        parts = [
            self.get_tensor(_writer_name(key, _Axis(AXIS_TP, r, count, split, 0, "")))
            for r in range(count)
        ]
        if any(p is None for p in parts):
            return None
        whole = _torch().cat(parts, dim=split)
        return whole if tuple(whole.shape) == shape else None

    def _writer_part(self, key: str, want: _Axis) -> Any:
        """Part `want.rank` of the writer partitions, when they are cut as `want` asks."""
        layout = self._writer_layout(key)
        if layout is None or layout[1] != want.split or layout[2] != want.size:
            return None
        return self.get_tensor(_writer_name(key, want))

    def _layout(self, key: str, axes: list[_Axis]) -> tuple[tuple[int, ...], int, int] | None:
        """(whole shape, split_dim, shard count) of the TP shards stored under `key`."""
        raw = self._raw(_manifest_key(key))
        layout = None if raw is None else _read_manifest(raw)
        if layout is not None:
            return layout
        if not any(a.kind == AXIS_TP for a in axes):
            return None
        first = self._raw(_shard_name(key, axes, 0))
        if first is None or parse_header(first) is None:
            return None
        shape, stored = shard_axes(first)
        tp_axes = [a for a in stored if a[0] == AXIS_TP]
        return (shape, tp_axes[0][4], tp_axes[0][3]) if tp_axes else None

    def _shard(self, key: str, axes: list[_Axis], rank: int) -> Any:
        return self.get_tensor(_shard_name(key, axes, rank))

    def _join(self, key: str, axes: list[_Axis]) -> Any:
        layout = self._layout(key, axes)
        if layout is None:
            return None
        shape, split, count = layout
        tp = next((a for a in axes if a.kind == AXIS_TP), None)
        template = axes
        if tp is None or tp.size != count or tp.split != split:
            template = [
                *(a for a in axes if a.kind != AXIS_TP),
                _Axis(AXIS_TP, 0, count, split, 0, f"tp_0of{count}_sd{split}"),
            ]
        parts = [self._shard(key, template, r) for r in range(count)]
        if any(p is None for p in parts):
            return None
        torch = _torch()
        whole = torch.cat(parts, dim=split)
        return whole if tuple(whole.shape) == shape else None

    def _reshard(self, key: str, want: _Axis) -> Any:
        layout = self._layout(key, [want])
        if layout is None:
            return None
        shape, split, count = layout
        if split != want.split:
            log.error("get_tensor_with_parallelism: split_dim mismatch")
            return None
        extent = shape[split]
        if extent % want.size or extent % count:
            log.error("get_tensor_with_parallelism: only uniform sharding is supported")
            return None
        lo, hi = extent * want.rank // want.size, extent * (want.rank + 1) // want.size
        step = extent // count
        template = [_Axis(AXIS_TP, 0, count, split, 0, f"tp_0of{count}_sd{split}")]
        parts = []
        for r in range(lo // step, -(-hi // step)):
            shard = self._shard(key, template, r)
            if shard is None:
                return None
            start, end = max(lo, r * step) - r * step, min(hi, (r + 1) * step) - r * step
            parts.append(shard.narrow(split, start, end - start))
        return _torch().cat(parts, dim=split).contiguous()
