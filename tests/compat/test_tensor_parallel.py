"""The parallelism descriptors and `*_tensor_with_parallelism*` (needs torch), on both backends.

The objects are compared byte for byte with what Mooncake's C structs give (`_header`,
`_manifest`, built here with `struct` from the layout in kvpool.compat.mooncake.tensor), and the
names with the wheel's (`<key>_tp_<rank>` for one TP axis, `<key>__dp_1of2__tp_0of2_sd1` for
several), so shards written by one are readable by the other. The expectations were taken from
mooncake-transfer-engine-non-cuda 0.3.13.post1.
"""

from __future__ import annotations

import struct
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

KIND = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
F32 = 0


def _axis(m: Any, kind: str, rank: int, size: int, **kw: int) -> Any:
    a = m.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    for name, value in kw.items():
        setattr(a, name, value)
    return a


def _par(m: Any, *axes: Any) -> Any:
    p = m.TensorParallelism()
    p.axes = list(axes)
    return p


def _target(m: Any, mode: str, parallelism: Any = None) -> Any:
    t = m.ReadTarget()
    t.mode = mode
    if parallelism is not None:
        t.parallelism = parallelism
    return t


def _dims(shape: tuple[int, ...]) -> bytes:
    return struct.pack("<8q", *shape, *([-1] * (8 - len(shape))))


def _header(gshape: tuple[int, ...], lshape: tuple[int, ...], axes: list[tuple[int, ...]],
            nbytes: int) -> bytes:  # fmt: skip
    head = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, F32, len(gshape), 1, 0, 304, nbytes)
    packed = b"".join(struct.pack("<iiiiiiq", *a) for a in axes)
    return (
        head + _dims(gshape) + _dims(lshape) + struct.pack("<II", len(axes), 0) + packed
        + bytes(32 * (4 - len(axes)))
    )  # fmt: skip


def _manifest(shape: tuple[int, ...], split: int, count: int) -> bytes:
    return struct.pack("<IHHIIiIII", 0x574D414E, 1, 96, F32, len(shape), split, count, 0, 0) + (
        _dims(shape)
    )


def _bytes(t: Any) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


T = torch.arange(24, dtype=torch.float32).view(4, 6)


def test_descriptors_have_the_wheels_defaults(backend: Any) -> None:
    m = backend.module
    a, p, t = m.ParallelAxis(), m.TensorParallelism(), m.ReadTarget()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == (
        "", 0, 1, None, None, None,
    )  # fmt: skip
    assert list(p.axes) == [] and t.mode == "as_stored" and t.parallelism is None


def test_no_parallelism_is_a_whole_tensor(backend: Any) -> None:
    s, m = backend.store(), backend.module
    assert s.put_tensor_with_parallelism("whole", T) == 0
    assert torch.equal(s.get_tensor("whole"), T)
    for target in (None, _target(m, "as_stored"), _target(m, "full")):
        assert torch.equal(s.get_tensor_with_parallelism("whole", target), T)
    p0 = _par(m, _axis(m, "tp", 0, 2, split_dim=1))
    assert s.get_tensor_with_parallelism("whole", _target(m, "shard", p0)) is None
    assert s.get_tensor_with_parallelism("missing", _target(m, "shard", p0)) is None


def test_one_tp_axis_stores_the_rank_shard_as_the_tp_calls_do(backend: Any) -> None:
    s, m = backend.store(), backend.module
    p0 = _par(m, _axis(m, "tp", 0, 2, split_dim=1))
    p1 = _par(m, _axis(m, "tp", 1, 2, split_dim=1))
    assert s.put_tensor_with_parallelism("tp", T, p0) == 0
    assert s.put_tensor_with_parallelism("tp", T + 100, p1) == 0
    assert s.get("tp_tp_0") == _header((4, 12), (4, 6), [(1, 0, 0, 2, 1, 0, 6)], 96) + _bytes(T)
    assert s.get("tp__parallelism_manifest") == _manifest((4, 12), 1, 2)
    assert s.is_exist("tp") == 0
    whole = torch.cat([T, T + 100], dim=1)
    assert torch.equal(s.get_tensor_with_parallelism("tp", _target(m, "full", p0)), whole)
    assert torch.equal(s.get_tensor_with_tp("tp", 1, 2), T + 100)
    for rank in range(4):  # resharded: rank r of 4 owns whole[:, 3r:3r+3]
        want = _target(m, "shard", _par(m, _axis(m, "tp", rank, 4, split_dim=1)))
        got = s.get_tensor_with_parallelism("tp", want)
        assert torch.equal(got, whole[:, 3 * rank : 3 * rank + 3])
    # Not reshardable (another split dimension, uneven): the stored shard of that rank.
    other = _target(m, "shard", _par(m, _axis(m, "tp", 1, 2, split_dim=0)))
    assert torch.equal(s.get_tensor_with_parallelism("tp", other), T + 100)
    uneven = _target(m, "shard", _par(m, _axis(m, "tp", 0, 5, split_dim=1)))
    assert torch.equal(s.get_tensor_with_parallelism("tp", uneven), T)
    assert s.get_tensor_with_parallelism("tp", _target(m, "as_stored", p0)) is None


def test_several_axes_name_the_shard_and_cut_it_from_the_whole_tensor(backend: Any) -> None:
    s, m = backend.store(), backend.module
    given = _par(m, _axis(m, "tp", 0, 2, split_dim=1), _axis(m, "dp", 1, 2))
    assert s.put_tensor_with_parallelism("multi", T, given) == 0
    name = "multi__dp_1of2__tp_0of2_sd1"  # axes named DP first; the header keeps their order
    axes = [(1, 0, 0, 2, 1, 0, 3), (0, 1, 1, 2, -1, 0, 0)]
    assert s.get(name) == _header((4, 6), (4, 3), axes, 48) + _bytes(T[:, :3])
    assert s.get("multi__parallelism_manifest") == _manifest((4, 6), 1, 2)
    assert torch.equal(s.get_tensor_with_parallelism("multi", _target(m, "shard", given)), T[:, :3])
    ep = _par(m, _axis(m, "ep", 0, 4, expert_id=3))
    assert s.put_tensor_with_parallelism("moe", T, ep) == 0
    assert s.get("moe__ep_0of4_eid3") == _header((4, 6), (4, 6), [(2, 0, 0, 4, -1, 3, 0)], 96) + (
        _bytes(T)
    )
    assert s.is_exist("moe__parallelism_manifest") == 0
    pp = _par(m, _axis(m, "pp", 1, 2, stage_id=1))
    assert s.put_tensor_with_parallelism("stage", T, pp) == 0
    assert s.get("stage__pp_1of2_sid1")[:304] == _header(
        (4, 6), (4, 6), [(3, 0, 1, 2, -1, 1, 0)], 96
    )
    assert torch.equal(s.get_tensor_with_parallelism("stage", _target(m, "shard", pp)), T)


def test_bad_descriptors_are_refused_with_minus_600(backend: Any) -> None:
    s, m = backend.store(), backend.module
    for axes in (
        [_axis(m, "xx", 0, 2)],
        [_axis(m, "tp", 2, 2, split_dim=0)],
        [_axis(m, "tp", 0, 2)],  # TP needs a split_dim
    ):
        assert s.put_tensor_with_parallelism("bad", T, _par(m, *axes)) == -600
    assert s.put_tensor_with_parallelism("bad", T, writer_partition=(0, 2, 0)) == -600  # a tuple
    assert s.is_exist("bad") == 0
    with pytest.raises(RuntimeError):
        _target(m, "weird")


def test_batch_forms_and_upsert(backend: Any) -> None:
    s, m = backend.store(), backend.module
    p0 = _par(m, _axis(m, "tp", 0, 2, split_dim=0))
    assert list(s.batch_put_tensor_with_parallelism(["b1", "b2"], [T, T + 1], [p0, None])) == [0, 0]
    assert s.is_exist("b1_tp_0") == 1 and s.is_exist("b2") == 1
    got = s.batch_get_tensor_with_parallelism(["b1", "b2"], [_target(m, "shard", p0), None])
    assert torch.equal(got[0], T) and torch.equal(got[1], T + 1)
    assert list(s.batch_put_tensor_with_parallelism(["c1", "c2"], [T], None)) == [-600, -600]
    assert list(s.batch_get_tensor_with_parallelism(["b1", "b2"], [None])) == [None, None]
    assert s.put_tensor_with_parallelism("b2", T * 0) == 0  # a put keeps the old value
    assert torch.equal(s.get_tensor("b2"), T + 1)
    assert s.upsert_tensor_with_parallelism("b1", T * 0, p0) == 0  # an upsert replaces it
    assert torch.equal(s.get_tensor_with_parallelism("b1", _target(m, "shard", p0)), T * 0)
    assert list(s.batch_upsert_tensor_with_parallelism(["b2"], [T * 2])) == [0]
    assert torch.equal(s.get_tensor("b2"), T * 2)


def test_from_and_into_registered_memory(backend: Any) -> None:
    s, m = backend.store(), backend.module
    header = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, F32, 2, 0, 0, 304, 96) + (
        _dims((4, 6)) + _dims((4, 6)) + bytes(8 + 4 * 32)
    )
    size = 96
    src = np.zeros(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    assert s.register_buffer(src.ctypes.data, src.nbytes) == 0
    assert s.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    src[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    src[len(header) : len(header) + size] = np.frombuffer(_bytes(T), dtype=np.uint8)
    n = len(header) + size
    p1 = _par(m, _axis(m, "tp", 1, 2, split_dim=1))
    # From memory the tensor is the whole one: the rank's shard is cut from it.
    assert s.put_tensor_with_parallelism_from("from", src.ctypes.data, n, p1) == 0
    assert torch.equal(s.get_tensor_with_parallelism("from", _target(m, "shard", p1)), T[:, 3:])
    assert s.put_tensor_with_parallelism_from("from-whole", src.ctypes.data, n) == 0
    assert torch.equal(s.get_tensor("from-whole"), T)
    assert list(
        s.batch_put_tensor_with_parallelism_from(["f1", "f2"], [src.ctypes.data] * 2, [n] * 2,
                                                 [p1, None])
    ) == [0, 0]  # fmt: skip
    got = s.get_tensor_with_parallelism_into("f2", dst.ctypes.data, dst.nbytes)
    assert torch.equal(got, T) and got.data_ptr() == dst.ctypes.data + 304
    assert s.get_tensor_with_parallelism_into("f2", dst.ctypes.data, 100) is None
    (into,) = s.batch_get_tensor_with_parallelism_into(
        ["f1"], [dst.ctypes.data], [dst.nbytes], [_target(m, "shard", p1)]
    )
    assert torch.equal(into, T[:, 3:])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn", "bool", "int64"])
def test_shards_round_trip_bit_exactly(backend: Any, dtype: str) -> None:
    s, m = backend.store(), backend.module
    dt = getattr(torch, dtype)
    raw = torch.randint(0, 256, (8 * 4 * dt.itemsize,), dtype=torch.uint8)
    if dt == torch.bool:
        raw = raw % 2
    whole = raw.view(dt).reshape(8, 4)
    for rank in range(2):
        p = _par(m, _axis(m, "tp", rank, 2, split_dim=0))
        assert s.put_tensor_with_parallelism(f"dt-{dtype}", whole[4 * rank : 4 * rank + 4], p) == 0
    full = s.get_tensor_with_parallelism(f"dt-{dtype}", _target(m, "full", p))
    assert full.dtype == dt and _bytes(full) == _bytes(whole)


def _writer(rank: int, size: int, split_dim: int) -> Any:
    return types.SimpleNamespace(rank=rank, size=size, split_dim=split_dim)


def test_writer_partitions_store_parts_of_the_whole_tensor(backend: Any) -> None:
    s, m = backend.store(), backend.module
    assert s.put_tensor_with_parallelism("w", T, writer_partition=_writer(0, 2, 0)) == 0
    part0 = _header((4, 6), (2, 6), [(1, 0, 0, 2, 0, 0, 2)], 48) + _bytes(T[:2])
    assert s.get("w__writer_0of2_sd0") == part0
    assert s.get("w__writer_manifest") == _manifest((4, 6), 0, 2)
    assert s.get_tensor_with_parallelism("w", _target(m, "full")) is None  # part 1 missing
    assert s.put_tensor_with_parallelism("w", T, writer_partition=_writer(1, 2, 0)) == 0
    assert torch.equal(s.get_tensor_with_parallelism("w", _target(m, "full")), T)
    half = _target(m, "shard", _par(m, _axis(m, "tp", 1, 2, split_dim=0)))
    assert torch.equal(s.get_tensor_with_parallelism("w", half), T[2:])
    for rank, size, dim in ((1, 4, 0), (1, 2, 1)):  # parts are not resharded
        other = _target(m, "shard", _par(m, _axis(m, "tp", rank, size, split_dim=dim)))
        assert s.get_tensor_with_parallelism("w", other) is None
    assert s.get_tensor_with_parallelism("w") is None  # no FULL object
    for bad in (_writer(2, 2, 0), _writer(0, 3, 0), _writer(0, 2, 5)):
        assert s.put_tensor_with_parallelism("w2", T, writer_partition=bad) == -600
    tp = _par(m, _axis(m, "tp", 0, 2, split_dim=0))
    assert s.put_tensor_with_parallelism("w3", T, tp, writer_partition=_writer(0, 2, 0)) == -600
    put = s.batch_put_tensor_with_parallelism
    assert list(put(["w4"], [T], None, writer_partitions=[_writer(0, 2, 1)])) == [0]
    assert s.is_exist("w4__writer_0of2_sd1") == 1
    assert list(put(["w5"], [T], [None], writer_partitions=[_writer(0, 2, 1)])) == [-600]
    assert list(put(["w6", "w7"], [T, T], None, writer_partitions=[_writer(0, 2, 1), None])) == [
        0,
        0,
    ]
    assert s.is_exist("w7") == 1
