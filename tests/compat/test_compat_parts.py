"""The compatibility layer's parts on their own: pointer registry, sizes, tensor header, config.

No pool is needed; the end-to-end behaviour is in the backend-parametrized suites.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from kvpool.client import ReplicateConfig as NativeReplicateConfig
from kvpool.client import SoftPinAction
from kvpool.compat.mooncake import BufferHandle, MooncakeDistributedStore, ReplicateConfig
from kvpool.compat.mooncake import tensor as tf
from kvpool.compat.mooncake.config import parse_mooncake_size
from kvpool.compat.mooncake.memory import PointerRegistry
from kvpool.compat.mooncake.setup import from_dict, split_hostname
from kvpool.errors import ErrorCode, InvalidParams, KVPoolError

# --------------------------------------------------------------------------------------------
# PointerRegistry


@pytest.fixture
def arena() -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(8192)


def test_a_pointer_resolves_only_inside_one_registration(
    arena: ctypes.Array[ctypes.c_char],
) -> None:
    base = ctypes.addressof(arena)
    reg = PointerRegistry()
    reg.add(base, 4096)
    view = reg.resolve(base + 10, 5)
    view[:] = b"hello"
    assert ctypes.string_at(base + 10, 5) == b"hello"
    assert reg.resolve(base, 4096).nbytes == 4096
    for addr, size in [
        (base + 4090, 7),  # runs past the end
        (base - 1, 2),  # starts before
        (base + 4096, 1),  # just after
        (base, 0),  # empty
        (16, 8),  # nowhere near
    ]:
        with pytest.raises(InvalidParams):
            reg.resolve(addr, size)
        assert reg.find(addr, size) is None


def test_registrations_never_overlap(arena: ctypes.Array[ctypes.c_char]) -> None:
    base = ctypes.addressof(arena)
    reg = PointerRegistry()
    reg.add(base + 1000, 1000)
    for addr, size in [(base + 1000, 1000), (base + 500, 501), (base + 1999, 10), (base, 0)]:
        with pytest.raises(InvalidParams):
            reg.add(addr, size)
    reg.add(base, 1000)  # touching is not overlapping
    reg.add(base + 2000, 1000)
    assert len(reg) == 3
    assert reg.resolve(base + 999, 1).nbytes == 1
    with pytest.raises(InvalidParams):
        reg.resolve(base + 999, 2)  # spans two registrations: not inside one


def test_unregister_needs_the_start_address(arena: ctypes.Array[ctypes.c_char]) -> None:
    base = ctypes.addressof(arena)
    reg = PointerRegistry()
    reg.add(base, 100)
    with pytest.raises(InvalidParams):
        reg.remove(base + 1)
    reg.remove(base)
    with pytest.raises(InvalidParams):
        reg.remove(base)
    assert reg.find(base, 1) is None
    with pytest.raises(TypeError):
        reg.add("0x1000", 10)  # type: ignore[arg-type]


def test_buffer_handle_exposes_pointer_and_size() -> None:
    h = BufferHandle(b"abc")
    assert h.size() == len(h) == 3 and bytes(memoryview(h)) == b"abc"
    assert ctypes.string_at(h.ptr(), 3) == b"abc"
    assert BufferHandle().ptr() == 0


# --------------------------------------------------------------------------------------------
# Sizes and setup arguments


@pytest.mark.parametrize(
    "text,expected",
    [
        ("16MB", 16 << 20),
        ("16 MB", 16 << 20),
        ("16mb", 16 << 20),
        ("16M", 16 << 20),
        ("16MiB", 16 << 20),
        ("1.5GB", 3 << 29),
        ("4k", 4096),
        ("1024", 1024),
        ("512b", 512),
        (3355443200, 3355443200),
    ],
)
def test_sizes_are_read_in_mooncakes_binary_units(text: str | int, expected: int) -> None:
    assert parse_mooncake_size(text) == expected


@pytest.mark.parametrize("bad", ["50%", "lots", "", "-1", "16 XB", True, None])
def test_bad_sizes_are_invalid_params(bad: object) -> None:
    with pytest.raises(InvalidParams):
        parse_mooncake_size(bad)


def test_dict_setup_defaults_follow_mooncake() -> None:
    p = from_dict({"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"})
    assert (p.global_segment_size, p.local_buffer_size) == (16 << 20, 16 << 20)
    assert p.protocol == "tcp" and p.master_server_addr == "127.0.0.1:50051"
    assert p.tenant_id == "default"
    p = from_dict(
        {
            "local_hostname": "h",
            "metadata_server": "x",
            "master_server_address": "m:1",
            "enable_ssd_offload": "false",
            "protocol": "RDMA",
        }
    )
    assert p.master_server_addr == "m:1" and p.enable_ssd_offload is False
    assert p.protocol == "rdma"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("127.0.0.1", ("127.0.0.1", None)),
        ("127.0.0.1:12345", ("127.0.0.1", 12345)),
        ("localhost", ("localhost", None)),
        ("[::1]:80", ("::1", 80)),
        ("::1", ("::1", None)),
    ],
)
def test_hostnames_split_into_host_and_port(text: str, expected: tuple[str, int | None]) -> None:
    assert split_hostname(text) == expected


def test_positional_setup_needs_seven_arguments() -> None:
    store = MooncakeDistributedStore()
    with pytest.raises(TypeError):
        store.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 20)
    assert store.health_check() == 1


# --------------------------------------------------------------------------------------------
# ReplicateConfig → kvpool's config


def test_replicate_config_translates_to_the_native_one() -> None:
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    cfg.soft_pin_action = SoftPinAction.ENABLE
    cfg.soft_pin_ttl_ms = 1000
    cfg.with_hard_pin = True
    cfg.preferred_segments = ["a:1"]
    cfg.preferred_segment = "b:2"
    cfg.group_ids = ["g"]
    native = cfg.to_native(lambda names: [f"{n}/0" for n in names])
    assert native == NativeReplicateConfig(
        replica_num=2,
        soft_pin_action=SoftPinAction.ENABLE,
        soft_pin_ttl_ms=1000,
        with_hard_pin=True,
        preferred_segments=("a:1/0", "b:2/0"),
        group_ids=("g",),
    )


def test_the_native_config_is_rebuilt_after_a_change() -> None:
    cfg = ReplicateConfig()
    first = cfg.to_native(list)
    assert cfg.to_native(list) is first  # cached
    cfg.replica_num = 3
    assert cfg.to_native(list).replica_num == 3


@pytest.mark.parametrize(
    "field,value,code",
    [
        ("nof_replica_num", 1, ErrorCode.INVALID_PARAMS),
        ("dfs_replica_num", 1, ErrorCode.DFS_SERVICE_UNAVAILABLE),
        ("replica_num", 0, ErrorCode.INVALID_PARAMS),
        ("soft_pin_ttl_ms", 5, ErrorCode.INVALID_PARAMS),  # with PRESERVE
    ],
)
def test_configs_kvpool_cannot_honour_carry_mooncakes_code(
    field: str, value: int, code: ErrorCode
) -> None:
    cfg = ReplicateConfig()
    setattr(cfg, field, value)
    with pytest.raises(KVPoolError) as info:
        cfg.to_native(list)
    assert info.value.code == code


def test_unknown_config_fields_are_refused() -> None:
    cfg = ReplicateConfig()
    with pytest.raises(AttributeError):
        cfg.replica_count = 2  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        cfg.preferred_segments = "a:1"


# --------------------------------------------------------------------------------------------
# Tensor objects


def test_tensor_header_round_trip() -> None:
    data = np.arange(12, dtype=np.int64).tobytes()
    blob = tf.encode_header("int64", (3, 4), len(data)) + data
    assert len(blob) == tf.HEADER_SIZE + len(data)
    h = tf.parse_header(blob)
    assert h == tf.TensorHeader("int64", (3, 4), tf.HEADER_SIZE, len(data))
    scalar = tf.encode_header("float32", (), 4) + b"\x00" * 4
    assert tf.parse_header(scalar) == tf.TensorHeader("float32", (), tf.HEADER_SIZE, 4)


def test_tensor_header_is_mooncakes_c_layout() -> None:
    blob = tf.encode_header("bfloat16", (2,), 4)
    magic, version, size, dtype, ndim, layout, _flags, off, nbytes = struct.unpack_from(
        "<IHHiiIIQQ", blob
    )
    assert (magic, version, size, dtype, ndim, layout, off, nbytes) == (
        0x4D4F4F4E, 1, 304, 12, 1, 0, 304, 4,
    )  # fmt: skip
    assert struct.unpack_from("<8q", blob, 40) == (2, -1, -1, -1, -1, -1, -1, -1)


def _corrupt(blob: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_tensor_headers_mooncake_refuses_are_refused() -> None:
    good = tf.encode_header("float32", (2, 3), 24) + bytes(24)
    assert tf.parse_header(good) is not None
    bad = [
        good[:-1],  # data_bytes no longer matches
        good[:100],  # shorter than a header
        _corrupt(good, 0, "<I", 0),  # magic
        _corrupt(good, 4, "<H", 2),  # version
        _corrupt(good, 8, "<i", 15),  # dtype
        _corrupt(good, 12, "<i", 9),  # ndim
        _corrupt(good, 16, "<I", 2),  # layout kind
        _corrupt(good, 24, "<Q", 100),  # data offset inside the header
        _corrupt(good, 40, "<q", 0),  # a zero dimension
        _corrupt(good, 40 + 16, "<q", 7),  # a dimension past ndim that is not -1
        _corrupt(good, 168, "<I", 5),  # too many layout axes
    ]
    for blob in bad:
        assert tf.parse_header(blob) is None


def test_tensor_calls_without_torch_answer_instead_of_raising() -> None:
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed: tests/compat/test_tensors.py covers the tensor calls")
    with pytest.raises(ImportError):
        tf.tensor_to_parts(object())
