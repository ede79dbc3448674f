"""Tensors, round 2 (needs torch; skipped without it): every CPU dtype torch has, tensor
parallelism (`*_tensor_with_tp*`) in Mooncake's shard format byte for byte, safetensors files,
and the CUDA calls' answer without a GPU.

Run on both backends: the shard objects are compared with the bytes Mooncake's C structs give
(`_shard_object`), so shards written by one are readable by the other.
"""

from __future__ import annotations

import ctypes
import struct
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

MOONCAKE_DTYPES = {
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


def _all_dtypes() -> list[Any]:
    """Every distinct dtype object the installed torch offers."""
    seen: dict[str, Any] = {}
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            seen.setdefault(str(value), value)
    return sorted(seen.values(), key=str)


def _random_tensor(dtype: Any, shape: tuple[int, ...]) -> Any:
    """Random bits of `dtype` (any bit pattern: NaNs, subnormals, every byte value)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = 1
    for d in shape:
        n *= d
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _bits(t: Any) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _shard_object(
    dtype: int, whole: tuple[int, ...], local: tuple[int, ...], rank: int, count: int, dim: int,
    data: bytes,
) -> bytes:  # fmt: skip
    """One TP shard as Mooncake's C structs lay it out (SHARD layout, one TP axis)."""
    pad = [-1] * (8 - len(whole))
    head = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype, len(whole), 1, 0, 304, len(data))
    layout = struct.pack("<8q", *whole, *pad) + struct.pack("<8q", *local, *pad)
    axes = struct.pack("<II", 1, 0) + struct.pack("<iiiiiiq", 1, 0, rank, count, dim, 0, local[dim])
    return head + layout + axes + bytes(3 * 32) + data


@pytest.mark.parametrize("dtype", _all_dtypes(), ids=str)
def test_every_cpu_dtype_round_trips_bit_exactly_or_is_refused(backend: Any, dtype: Any) -> None:
    store = backend.store()
    name = str(dtype).removeprefix("torch.")
    if name not in MOONCAKE_DTYPES:
        try:
            with warnings.catch_warnings():  # complex32 and quantized dtypes warn when made
                warnings.simplefilter("ignore")
                t = torch.zeros(4, dtype=dtype)
        except (RuntimeError, TypeError):
            pytest.skip(f"{dtype} cannot be created on this CPU")
        assert store.put_tensor(f"d-{name}", t) == -600  # Mooncake has no code for it
        return
    t = _random_tensor(dtype, (3, 5, 2))
    assert store.put_tensor(f"d-{name}", t) == 0
    back = store.get_tensor(f"d-{name}")
    assert back.dtype == dtype and tuple(back.shape) == (3, 5, 2)
    assert _bits(back) == _bits(t)


@pytest.mark.parametrize("split_dim", [0, 1, 2])
@pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "bool", "float8_e5m2"])
def test_tp_shards_are_mooncakes_objects_and_rejoin_bit_exactly(
    backend: Any, name: str, split_dim: int
) -> None:
    store = backend.store()
    dtype = getattr(torch, name)
    t = _random_tensor(dtype, (4, 6, 2))
    key = f"tp-{name}-{split_dim}"
    assert store.put_tensor_with_tp(key, t, tp_rank=1, tp_size=2, split_dim=split_dim) == 0
    shards = [store.get_tensor_with_tp(key, tp_rank=r, tp_size=2) for r in range(2)]
    assert _bits(torch.cat(shards, dim=split_dim)) == _bits(t)
    for rank, shard in enumerate(shards):
        expect = _shard_object(
            MOONCAKE_DTYPES[name], (4, 6, 2), tuple(shard.shape), rank, 2, split_dim, _bits(shard)
        )
        assert store.get(f"{key}_tp_{rank}") == expect
    # tp_size 1 is the plain call on the key itself.
    assert store.put_tensor_with_tp(f"{key}-whole", t) == 0
    assert _bits(store.get_tensor_with_tp(f"{key}-whole")) == _bits(t)


def test_tp_refuses_uneven_splits_and_bad_dimensions(backend: Any) -> None:
    store = backend.store()
    t = torch.zeros(5, 4)
    assert store.put_tensor_with_tp("uneven", t, 0, 2, 0) == -600
    assert store.put_tensor_with_tp("nodim", t, 0, 2, 2) == -600
    assert store.get_tensor_with_tp("uneven", 0, 2) is None
    assert store.put_tensor_with_tp("ok", t, 0, 2, 1) == 0


def test_tp_batch_pub_and_into_forms(backend: Any) -> None:
    store = backend.store()
    ts = [torch.arange(8, dtype=torch.float32).reshape(2, 4) + i for i in range(2)]
    assert store.batch_put_tensor_with_tp(["a", "b"], ts, tp_size=2, split_dim=1) == [0, 0]
    got = store.batch_get_tensor_with_tp(["a", "b", "none"], tp_rank=1, tp_size=2)
    assert torch.equal(got[0], ts[0][:, 2:]) and torch.equal(got[1], ts[1][:, 2:])
    assert got[2] is None
    cfg = backend.module.ReplicateConfig()
    assert store.pub_tensor_with_tp("p", ts[0], cfg, 0, 2, 0) == 0
    assert store.batch_pub_tensor_with_tp(["q"], [ts[1]], cfg, 0, 2, 0) == [0]
    assert torch.equal(store.get_tensor_with_tp("q", 1, 2), ts[1][1:])
    assert store.batch_put_tensor_with_tp(["x", "y"], ts[:1], tp_size=2) == [-600, -600]

    arena = ctypes.create_string_buffer(1 << 16)
    base = ctypes.addressof(arena)
    assert store.register_buffer(base, 1 << 16) == 0
    shard = store.get_tensor_with_tp_into("a", base, 1 << 15, 1, 2)
    assert torch.equal(shard, ts[0][:, 2:])
    both = store.batch_get_tensor_with_tp_into(
        ["a", "b"], [base, base + (1 << 15)], [1 << 15, 1 << 15], 0, 2
    )
    assert torch.equal(both[0], ts[0][:, :2]) and torch.equal(both[1], ts[1][:, :2])
    assert store.unregister_buffer(base) == 0


def test_tp_from_a_registered_tensor_object(backend: Any) -> None:
    store = backend.store()
    t = torch.arange(12, dtype=torch.int32).reshape(4, 3)
    assert store.put_tensor("whole", t) == 0
    obj = store.get("whole")
    arena = ctypes.create_string_buffer(len(obj))
    ctypes.memmove(arena, obj, len(obj))
    base = ctypes.addressof(arena)
    assert store.register_buffer(base, len(obj)) == 0
    assert store.put_tensor_with_tp_from("split", base, len(obj), 0, 2, 0) == 0
    assert torch.equal(store.get_tensor_with_tp("split", 1, 2), t[2:])
    assert store.batch_put_tensor_with_tp_from(["s2"], [base], [len(obj)], 0, 4, 0) == [0]
    assert torch.equal(store.get_tensor_with_tp("s2", 3, 4), t[3:])
    assert store.put_tensor_with_tp_from("short", base, 100, 0, 2, 0) == -600
    assert store.unregister_buffer(base) == 0


def test_safetensors_files_round_trip(backend: Any, tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    store = backend.store()
    t = _random_tensor(torch.bfloat16, (3, 4))
    assert store.put_tensor("st", t) == 0
    path = tmp_path / "st.safetensors"
    assert store.save_tensor_to_safetensor("st", str(path)) == 0
    assert store.save_tensor_to_safetensor("missing", str(tmp_path / "m")) == -1100
    loaded = store.load_tensor_from_safetensor("st-copy", str(path))  # not an entry: the first
    assert _bits(loaded) == _bits(t)
    assert _bits(store.get_tensor("st-copy")) == _bits(t)
    assert _bits(store.load_tensor_from_safetensor("st", str(path))) == _bits(t)
    assert store.load_tensor_from_safetensor("x", str(tmp_path / "nope")) is None


def test_cuda_reads_answer_600_without_a_dummy_client(backend: Any) -> None:
    store = backend.store()
    assert store.put_tensor("c", torch.ones(2)) == 0
    assert store.get_tensor_into_cuda("c", torch.empty(2)) == -600
    assert store.batch_get_tensor_into_cuda(["c", "c"], [torch.empty(2)] * 2) == [-600, -600]


def test_module_serialize_functions_match_the_stored_format(backend: Any) -> None:
    """`_serialize_tensor` / `_deserialize_tensor` / `_tensor_metadata_size`, module functions
    of Mooncake's `mooncake.store` (the shim offers kvpool's)."""
    if backend.name == "kvpool":
        from kvpool.compat.mooncake import tensor as module

        ser, de, size = (
            module.serialize_tensor,
            module.deserialize_tensor,
            module.tensor_metadata_size,
        )
    else:
        m = backend.module
        ser, de, size = m._serialize_tensor, m._deserialize_tensor, m._tensor_metadata_size
    store = backend.store()
    t = _random_tensor(torch.float16, (2, 3))
    header, ptr, nbytes, _owner = ser(t)
    assert size() == 304 == len(header) and nbytes == 12 and ptr != 0
    assert store.put_tensor("ser", t) == 0
    assert store.get("ser") == header + _bits(t)
    assert _bits(de(header + _bits(t))) == _bits(t)
    with pytest.raises(ValueError):
        de(b"not a tensor")
    with pytest.raises(ValueError):
        ser(torch.zeros(2, dtype=torch.complex64))
