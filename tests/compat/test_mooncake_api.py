"""Mooncake's Python API, call by call: the answers docs/compat.md lists under "What matches".

Each scenario below is a table of calls and the value Mooncake returns for them, observed on the
real wheel (mooncake-transfer-engine-non-cuda 0.3.13.post1) on loopback. A scenario runs on a
fresh, set-up store, against each backend (see conftest.py), so the two implementations answer
the same table in one run. Where kvpool answers differently on purpose, the row says so with
``kvpool=`` and ``why=``; docs/compat.md lists those rows.

Pointer arguments are ``Ptr(offset)`` (an address inside the scenario's 1 MiB arena, which the
scenario may register) or ``Foreign(offset)`` (an address inside memory that is never registered).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from kvtest.procs import wait_until

ARENA = 1 << 20


# --------------------------------------------------------------------------------------------
# The table's vocabulary


@dataclass(frozen=True)
class Ptr:
    """The address `offset` bytes into the scenario's arena."""

    offset: int = 0


@dataclass(frozen=True)
class Foreign:
    """The address `offset` bytes into memory that no one registered."""

    offset: int = 0


@dataclass(frozen=True)
class Cfg:
    """A ReplicateConfig of the backend with these fields set (enum fields by member name)."""

    fields: dict[str, Any]

    def __init__(self, **fields: Any) -> None:
        object.__setattr__(self, "fields", fields)


@dataclass(frozen=True)
class Arr2D:
    """A 2-D numpy array (Mooncake's parts must be 1-D)."""


class _Neg:
    def __repr__(self) -> str:
        return "<any negative int>"


NEG = _Neg()


@dataclass(frozen=True)
class Raises:
    exc: type[BaseException]


@dataclass(frozen=True)
class Handle:
    """A BufferHandle holding `data` (len, size(), ptr(), buffer protocol)."""

    data: bytes


@dataclass(frozen=True)
class Handles:
    items: tuple[bytes | None, ...]


@dataclass(frozen=True)
class Replicas:
    """A list of `sizes`-many COMPLETE memory ReplicaDescriptors in this store's segment."""

    sizes: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaMap:
    """batch_get_replica_desc's dict: key → Replicas."""

    items: dict[str, Replicas]

    def __hash__(self) -> int:
        return hash(tuple(self.items))


class Call:
    """store.<method>(*args) must return `expect` (kvpool: `kvpool`, when given, because `why`)."""

    def __init__(
        self, method: str, *args: Any, expect: Any, kvpool: Any = ..., why: str = ""
    ) -> None:
        self.method = method
        self.args = args
        self.expect = expect
        self.kvpool = kvpool
        self.why = why


class Eventually:
    """store.<method>(*args) returns `expect` within a few lease periods."""

    def __init__(self, method: str, *args: Any, expect: Any) -> None:
        self.method = method
        self.args = args
        self.expect = expect


@dataclass(frozen=True)
class Fill:
    """Write `data` into the arena at `offset`."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class Peek:
    """The arena holds `data` at `offset`."""

    offset: int
    data: bytes


Step = Call | Eventually | Fill | Peek

HELLO = b"hello world"


def _tensor_object(dtype: int, shape: tuple[int, ...], data: bytes) -> bytes:
    """Mooncake's tensor object, built by hand from the C structs (not with kvpool's encoder)."""
    dims = [*shape, *([-1] * (8 - len(shape)))]
    head = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, dtype, len(shape), 0, 0, 304, len(data))
    layout = struct.pack("<8q", *dims) * 2 + struct.pack("<II", 0, 0) + bytes(4 * 32)
    return head + layout + data


TENSOR_2X3 = _tensor_object(0, (2, 3), np.arange(6, dtype=np.float32).tobytes())

# --------------------------------------------------------------------------------------------
# The table

SCENARIOS: dict[str, list[Step]] = {
    "put_is_insert_if_absent": [
        Call("put", "k1", HELLO, expect=0),
        Call("put", "k1", b"a different value", expect=0),  # no overwrite, still 0
        Call("get", "k1", expect=HELLO),
        Call("get", "nope", expect=b""),
        Call("put", "k2", bytearray(b"from a bytearray"), expect=0),
        Call("put", "k3", memoryview(b"xxfrom a memoryview")[2:], expect=0),
        Call("get_batch", ["k2", "k3"], expect=[b"from a bytearray", b"from a memoryview"]),
        Call("put", "k4", np.arange(4, dtype=np.uint8), expect=0),
        Call("get", "k4", expect=b"\x00\x01\x02\x03"),
    ],
    "invalid_puts": [
        Call("put", "empty", b"", expect=-600),
        Call("put", "", b"x", expect=-600),
        Call("get", "", expect=b""),
        Call("put", "str", "not a buffer", expect=Raises(TypeError)),
        Call("put", "big", b"z" * ((16 << 20) + 1), expect=-600),
        Call("is_exist", "big", expect=0),
    ],
    "exist_and_size": [
        Call("put", "k1", HELLO, expect=0),
        Call("is_exist", "k1", expect=1),
        Call("is_exist", "nope", expect=0),
        Call("is_exist", "", expect=0),
        Call("batch_is_exist", ["k1", "nope"], expect=[1, 0]),
        Call("batch_is_exist", [], expect=[]),
        Call("get_size", "k1", expect=11),
        Call("get_size", "nope", expect=-704),
        Call("get_size", "", expect=-704),
    ],
    "upsert_overwrites": [
        Call("put", "k1", b"old", expect=0),
        Call("upsert", "k1", b"new value", expect=0),
        Call("get", "k1", expect=b"new value"),
        Call("upsert", "fresh", b"inserted", expect=0),
        Call("get", "fresh", expect=b"inserted"),
        Call("upsert_parts", "k1", b"a", b"b", expect=0),
        Call("get", "k1", expect=b"ab"),
        Call("upsert_batch", ["k1", "k9"], [b"X", b"Y"], expect=0),
        Call("get_batch", ["k1", "k9"], expect=[b"X", b"Y"]),
    ],
    "put_parts_concatenates": [
        Call("put_parts", "k2", b"ab", b"cd", b"ef", expect=0),
        Call("get", "k2", expect=b"abcdef"),
        Call("put_parts", "k3", bytearray(b"12"), memoryview(b"34"), expect=0),
        Call("get", "k3", expect=b"1234"),
        Call("put_parts", "k4", b"a", Arr2D(), expect=Raises(RuntimeError)),
    ],
    "batches": [
        Call("put_batch", ["b1", "b2"], [b"v1", b"v2"], expect=0),
        Call("get_batch", ["b1", "b2", "nope"], expect=[b"v1", b"v2", b""]),
        Call("put_batch", ["b3", "b4"], [b"x"], expect=-600),
        Call("batch_is_exist", ["b3", "b4"], expect=[0, 0]),
        Call("put_batch", [], [], expect=0),
        Call("put_batch", ["b1", "b5"], [b"x", b""], expect=-600),
        Call("get", "b1", expect=b"v1"),
        # Mooncake's whole-batch failure answer: one b"" whatever the length asked for.
        Call("get_batch", [], expect=[b""]),
        # A key named twice in one batch is written once, with its first value.
        Call("put_batch", ["d1", "d1"], [b"first", b"second"], expect=0),
        Call("get", "d1", expect=b"first"),
        Call("upsert_batch", ["u1", "u1"], [b"first", b"second"], expect=0),
        Call("get", "u1", expect=b"first"),
        Call(
            "put_batch",
            ["g1", "g1", "g2"],
            [b"1", b"2", b"3"],
            Cfg(group_ids=["a", "a", "b"]),
            expect=0,
        ),
        Call("get_batch", ["g1", "g2"], expect=[b"1", b"3"]),
        Call("put_batch", ["g3", "g4"], [b"1", b"2"], Cfg(group_ids=["a"]), expect=-600),
        Call("batch_is_exist", ["g3", "g4"], expect=[0, 0]),
    ],
    "replicate_configs": [
        Call("put", "r2", b"x", Cfg(replica_num=2), expect=0),  # best effort: one segment
        Call("put", "sp", b"x", Cfg(soft_pin_action="ENABLE"), expect=0),
        Call("put", "spt", b"x", Cfg(soft_pin_action="ENABLE", soft_pin_ttl_ms=1000), expect=0),
        Call("put", "hp", b"x", Cfg(with_hard_pin=True), expect=0),
        Call("get_batch", ["r2", "sp", "spt", "hp"], expect=[b"x"] * 4),
        Call("put", "ttl-p", b"x", Cfg(soft_pin_ttl_ms=1000), expect=-600),
        Call("put", "ttl-d", b"x", Cfg(soft_pin_action="DISABLE", soft_pin_ttl_ms=1), expect=-600),
        Call("upsert", "ttl-u", b"x", Cfg(soft_pin_ttl_ms=1000), expect=-600),
        Call("put", "r0", b"x", Cfg(replica_num=0), expect=-600),
        Call("put", "nof", b"x", Cfg(nof_replica_num=1), expect=-600),
        Call("put", "dfs", b"x", Cfg(dfs_replica_num=1), expect=-1601),
        Call("put", "pseg", b"x", Cfg(preferred_segments=["nosuch:1"]), expect=0),
        Call("put", "data", b"x", Cfg(data_type="KVCACHE", group_ids=["g"]), expect=0),
        Call(
            "put",
            "same",
            b"x",
            Cfg(prefer_alloc_in_same_node=True),
            expect=-600,
            kvpool=0,
            why="Mooncake's copying put does not implement prefer_alloc_in_same_node; "
            "kvpool places the replica on a segment of this host when it can",
        ),
    ],
    "buffer_handles": [
        Call("put", "k1", b"X", expect=0),
        Call("get_buffer", "k1", expect=Handle(b"X")),
        Call("get_buffer", "nope", expect=None),
        Call("batch_get_buffer", ["k1", "nope"], expect=Handles((b"X", None))),
    ],
    "zero_copy": [
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Call("register_buffer", Ptr(), ARENA, expect=-600),  # twice
        Call("register_buffer", Ptr(100), 1000, expect=-600),  # overlaps
        Call("register_buffer", Foreign(), 0, expect=-600),
        Fill(0, b"0123456789"),
        Call("put_from", "pf", Ptr(), 10, expect=0),
        Call("get_into", "pf", Ptr(1000), 100, expect=10),
        Peek(1000, b"0123456789"),
        Call("get_into", "pf", Ptr(2000), 10, expect=10),
        Call("get_into", "pf", Ptr(2000), 9, expect=-600),  # "User buffer too small"
        Call("get_into", "pf", Ptr(2000), 0, expect=-600),
        Call("get_into", "nope", Ptr(2000), 100, expect=-704),
        Call("batch_put_from", ["bp1", "bp2"], [Ptr(), Ptr(3)], [3, 4], expect=[0, 0]),
        Call("batch_put_from", ["x", "y"], [Ptr()], [1, 1], expect=[-600, -600]),
        Call(
            "batch_get_into",
            ["bp1", "bp2", "nope"],
            [Ptr(5000), Ptr(6000), Ptr(7000)],
            [100, 200, 100],
            expect=[3, 4, -704],
        ),
        Peek(5000, b"012"),
        Peek(6000, b"3456"),
        Call("batch_get_into", ["bp1", "bp2"], [Ptr(5000)], [100], expect=[-600, -600]),
        Call("batch_get_into", ["pf"], [Ptr(8000)], [5], expect=[-600]),
        Call("put_from_with_metadata", "pfm", Ptr(5), Ptr(0), 5, 3, expect=0),
        Call("get", "pfm", expect=b"01256789"),
        Call("upsert_from", "pf", Ptr(2), 4, expect=0),
        Call("get", "pf", expect=b"2345"),
        Call("batch_upsert_from", ["pf", "new"], [Ptr(), Ptr()], [2, 3], expect=[0, 0]),
        Call("get_batch", ["pf", "new"], expect=[b"01", b"012"]),
        Call("unregister_buffer", Ptr(100), expect=-600),  # not the start of a registration
        Call("unregister_buffer", Ptr(), expect=0),
        Call("unregister_buffer", Ptr(), expect=-600),
    ],
    "multi_buffers": [
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Fill(0, b"0123456789"),
        Call("batch_put_from_multi_buffers", ["mb1"], [[Ptr(), Ptr(5)]], [[2, 3]], expect=[0]),
        Call("get", "mb1", expect=b"01567"),
        Call(
            "batch_get_into_multi_buffers",
            ["mb1", "nope"],
            [[Ptr(9000), Ptr(9100)], [Ptr(9200)]],
            [[1, 4], [10]],
            expect=[5, -704],
        ),
        Peek(9000, b"0"),
        Peek(9100, b"1567"),
        Call("batch_get_into_multi_buffers", ["mb1"], [[Ptr(9000)]], [[2]], expect=[-600]),
    ],
    "get_into_ranges": [
        Call("put", "k1", b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", expect=0),
        Call("put", "k2", b"abcdefghijklmnopqrstuvwxyz0123456789", expect=0),
        Call("register_buffer", Ptr(), 64, expect=0),
        Call("register_buffer", Ptr(64), 64, expect=0),
        Call(
            "get_into_ranges",
            [Ptr(), Ptr(64)],
            [["k1", "k2"], ["k2", "k1"]],
            [[[0, 20], [8]], [[4], [16]]],
            [[[1, 30], [2]], [[0], [10]]],
            [[[4, 3], [5]], [[6], [4]]],
            expect=[[[4, 3], [5]], [[6], [4]]],
        ),
        Peek(0, b"1234"),
        Peek(8, b"cdefg"),
        Peek(20, b"UVW"),
        Peek(64 + 4, b"abcdef"),
        Peek(64 + 16, b"ABCD"),
        # Mismatched shapes answer -600 at the level where they occur.
        Call(
            "get_into_ranges",
            [Ptr()],
            [["k1", "k2"]],
            [[[0], []]],
            [[[0, 1], []]],
            [[[4, 4], []]],
            expect=[[[-600], []]],
        ),
        Call(
            "get_into_ranges",
            [Ptr(), Ptr(64)],
            [["k1"]],
            [[[0]]],
            [[[0]]],
            [[[4]]],
            expect=[[[-600]], [[-600]]],
        ),
        Call(
            "get_into_ranges",
            [Ptr()],
            [["k1", "k2"]],
            [[[0]]],
            [[[0]]],
            [[[4]]],
            expect=[[[-600], [-600]]],
        ),
        # Out of the object, out of the buffer, missing, empty, and a pointer mid-buffer.
        Call("get_into_ranges", [Ptr()], [["k1"]], [[[0]]], [[[35]]], [[[4]]], expect=[[[-600]]]),
        Call("get_into_ranges", [Ptr()], [["k1"]], [[[63]]], [[[0]]], [[[4]]], expect=[[[-600]]]),
        Call(
            "get_into_ranges",
            [Ptr()],
            [["k1"]],
            [[[0, 62]]],
            [[[0, 0]]],
            [[[4, 4]]],
            expect=[[[4, -600]]],
        ),
        Call(
            "get_into_ranges",
            [Ptr()],
            [["missing", "k1"]],
            [[[0], [8]]],
            [[[0], [0]]],
            [[[4], [4]]],
            expect=[[[-704], [4]]],
        ),
        Call("get_into_ranges", [Ptr()], [["k1"]], [[[0]]], [[[0]]], [[[0]]], expect=[[[0]]]),
        Call(
            "get_into_ranges", [Foreign()], [["k1"]], [[[0]]], [[[0]]], [[[4]]], expect=[[[-600]]]
        ),
        Call("get_into_ranges", [Ptr(4)], [["k1"]], [[[0]]], [[[0]]], [[[4]]], expect=[[[4]]]),
        Call("get_into_ranges", [], [], [], [], [], expect=[]),
    ],
    "unregistered_memory_is_refused": [
        Fill(0, b"0123456789"),
        Call(
            "put_from",
            "u1",
            Foreign(),
            10,
            expect=0,
            kvpool=-600,
            why="kvpool never dereferences an address outside every registered buffer; "
            "Mooncake's TCP path copies from any address",
        ),
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Call("put_from", "u2", Ptr(), 10, expect=0),
        Call(
            "get_into",
            "u2",
            Foreign(),
            100,
            expect=10,
            kvpool=-600,
            why="kvpool never writes to an address outside every registered buffer",
        ),
        Call(
            "get_into",
            "u2",
            Ptr(ARENA - 5),
            100,
            expect=10,
            kvpool=-600,
            why="the range runs past the end of the registered buffer",
        ),
        Call(
            "batch_put_from",
            ["u3", "u4"],
            [Ptr(), Foreign()],
            [3, 3],
            expect=[0, 0],
            kvpool=[0, -600],
            why="checked per key",
        ),
        # SGLang passes one group id per key; a key refused here must not upset the others'.
        Call(
            "batch_put_from",
            ["g1", "g2", "g3"],
            [Ptr(), Foreign(), Ptr(3)],
            [3, 3, 3],
            Cfg(group_ids=["a", "b", "c"]),
            expect=[0, 0, 0],
            kvpool=[0, -600, 0],
            why="checked per key",
        ),
        Call("get_batch", ["g1", "g3"], expect=[b"012", b"345"]),
        Call(
            "put_from",
            "u5",
            Ptr(),
            0,
            expect=0,
            kvpool=-600,
            why="an empty object is refused, as put() of b'' is in both",
        ),
    ],
    "reads_grant_leases": [
        Call("put", "k1", HELLO, expect=0),
        Call("get", "k1", expect=HELLO),
        Call("remove", "k1", expect=-706),
        Call("remove", "nope", expect=-704),
        Call("remove", "", expect=-704),
        Call("remove", "k1", True, expect=0),
        Call("is_exist", "k1", expect=0),
        Call("put", "e1", b"x", expect=0),
        Call("is_exist", "e1", expect=1),  # exist checks grant a lease too
        Call("remove", "e1", expect=-706),
        Eventually("remove", "e1", expect=0),  # once the lease runs out
        Call("put", "s1", b"x", expect=0),
        Call("get_size", "s1", expect=1),
        Call("batch_remove", ["s1", "nope"], expect=[-706, -704]),
        Call("batch_remove", ["s1", "nope"], True, expect=[0, -704]),
        Call("batch_remove", [], expect=[]),
    ],
    "bulk_removal_counts": [
        Call("put_batch", ["pf1", "pf2", "other"], [b"1", b"2", b"3"], expect=0),
        Call("put_batch", ["q1", "q2", "q3"], [b"1", b"2", b"3"], expect=0),
        Call("get_batch", ["pf1", "pf2", "other"], expect=[b"1", b"2", b"3"]),
        Call("remove_by_regex", "^pf", expect=0),  # all leased: skipped
        Call("remove_by_regex", "^pf", True, expect=2),
        Call("remove_by_regex", "(", expect=-600),
        Call("remove_all", expect=3),  # q1..q3; "other" is leased
        Call("remove_all", True, expect=1),
        Call("remove_all", True, expect=0),
    ],
    "regex_is_a_search": [
        Call("put_batch", ["xpf1", "pf2", "zz"], [b"1", b"2", b"3"], expect=0),
        Call("remove_by_regex", "pf", True, expect=2),
        Call("batch_is_exist", ["xpf1", "pf2", "zz"], expect=[0, 0, 1]),
    ],
    "tensor_objects_from_memory": [
        # [304-byte TensorMetadata][data] (tensor.py), checked by the wheel's put_tensor_from.
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Fill(0, TENSOR_2X3),
        Call("put_tensor_from", "t1", Ptr(), len(TENSOR_2X3), expect=0),
        Call("get", "t1", expect=TENSOR_2X3),
        Call("get_size", "t1", expect=len(TENSOR_2X3)),
        Fill(4096, bytes(304) + TENSOR_2X3[304:]),
        Call("put_tensor_from", "t2", Ptr(4096), len(TENSOR_2X3), expect=-600),
        Call("put_tensor_from", "t3", Ptr(), len(TENSOR_2X3) - 4, expect=-600),
        Call(
            "batch_put_tensor_from",
            ["t4", "t5"],
            [Ptr(), Ptr(4096)],
            [len(TENSOR_2X3)] * 2,
            expect=[-600, -600],  # one bad header fails the whole batch
        ),
        Call("upsert_tensor_from", "t1", Ptr(), len(TENSOR_2X3), expect=0),
        Call("batch_is_exist", ["t1", "t2", "t3", "t4", "t5"], expect=[1, 0, 0, 0, 0]),
    ],
    "replica_descriptors": [
        Call("put", "k1", HELLO, expect=0),
        Call("get_replica_desc", "k1", expect=Replicas((11,))),
        Call("get_replica_desc", "nope", expect=[]),
        Call("get_replica_desc", "", expect=[]),
        Call("remove", "k1", expect=-706),  # reading descriptors grants a lease
        Call("put", "k2", b"22", expect=0),
        Call(
            "batch_get_replica_desc",
            ["k1", "k2"],
            expect=ReplicaMap({"k1": Replicas((11,)), "k2": Replicas((2,))}),
        ),
        Call("batch_get_replica_desc", [], expect={}),
        Call("get_replica_desc", 1, expect=Raises(TypeError)),
    ],
    "task_refusals": [
        # Tasks that move bytes need two stores (test_replica_tasks.py); these need none.
        Call("put", "k1", HELLO, expect=0),
        Call("create_copy_task", "nope", ["nosuch:1"], expect=((0, 0), -704)),
        Call("create_copy_task", "k1", ["nosuch:1"], expect=((0, 0), -600)),
        Call("create_copy_task", "k1", [], expect=((0, 0), -600)),
        Call("create_move_task", "nope", "a:1", "b:1", expect=((0, 0), -704)),
        Call("create_move_task", "k1", "nosuch:1", "nosuch:2", expect=((0, 0), -600)),
        Call("query_task", (1, 2), expect=(None, -1400)),
        Call("query_task", "not a pair", expect=Raises(TypeError)),
    ],
    "replica_clear": [
        # A put leaves no lease (only reads grant one), so its replicas can be cleared at once.
        Call("put_batch", ["c1", "c2"], [b"1", b"2"], expect=0),
        Call("batch_replica_clear", ["c1", "c2", "nope"], expect=["c1", "c2"]),
        Call("batch_is_exist", ["c1", "c2"], expect=[0, 0]),
        Call("batch_replica_clear", ["c1"], expect=[]),
        Call("put", "c3", b"3", expect=0),
        Call("get", "c3", expect=b"3"),
        Call("batch_replica_clear", ["c3"], expect=[]),  # leased by the read
        Eventually("batch_replica_clear", ["c3"], expect=["c3"]),
        Call("put", "c4", b"4", expect=0),
        Call("batch_replica_clear", ["c4"], "nosuch:1", expect=[]),
        Call("batch_is_exist", ["c4"], expect=[1]),
        Call("batch_replica_clear", [], expect=[]),
    ],
    "put_sessions": [
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Fill(0, b"0123456789ABCDEF"),
        Call("batch_put_from_multi_buffer_ranges", ["r1"], [[Ptr()]], [[4]], [[0]], expect=[-600]),
        Call("batch_put_session_start", ["r1", "r2"], [8, 6], expect=[0, 0]),
        Call(
            "batch_put_from_multi_buffer_ranges",
            ["r1", "r2"],
            [[Ptr(), Ptr(8)], [Ptr(2)]],
            [[4, 4], [6]],
            [[0, 4], [0]],
            expect=[8, 6],
        ),
        Call("get", "r1", expect=b""),  # not readable before the end
        Call("is_exist", "r1", expect=0),
        Call("batch_put_session_end", ["r1", "r2"], expect=[0, 0]),
        Call("get_batch", ["r1", "r2"], expect=[b"012389AB", b"234567"]),
        Call("batch_put_session_end", ["r1"], expect=[-600]),
        Call("batch_put_session_start", ["r1", "r3"], [8, 3], expect=[-705, 0]),
        Call("batch_put_session_revoke", ["r3"], expect=[0]),
        Call("is_exist", "r3", expect=0),
        Call("batch_put_session_revoke", ["nope"], expect=[-600]),
        Call("batch_put_session_start", ["x1"], [1, 2], expect=[-600]),
        Call("batch_put_session_start", ["x2"], [0], expect=[-600]),
        Call("batch_put_session_start", ["r4"], [4], expect=[0]),
        Call("batch_put_from_multi_buffer_ranges", ["r4"], [[Ptr()]], [[8]], [[0]], expect=[-600]),
        Call(
            "batch_put_from_multi_buffer_ranges",
            ["r4"],
            [[Foreign()]],
            [[4]],
            [[0]],
            expect=[4],
            kvpool=[-600],
            why="kvpool never dereferences an address outside every registered buffer",
        ),
        Call("batch_put_session_revoke", ["r4"], expect=[0]),
        Call("batch_put_session_start", ["r5"], [8], expect=[0]),
        Call("batch_put_from_multi_buffer_ranges", ["r5"], [[Ptr()]], [[4]], [[0]], expect=[4]),
        Call("batch_put_session_end", ["r5"], expect=[0]),
        Call("get", "r5", expect=b"0123\x00\x00\x00\x00"),  # never written: zeros
        # Shapes: an outer mismatch fails every key, an inner one its key; no ranges → -702.
        Call("batch_put_session_start", ["s1", "s2", "s1"], [4, 4, 4], expect=[0, 0, -705]),
        Call(
            "batch_put_from_multi_buffer_ranges",
            ["s1", "s2"],
            [[Ptr()]],
            [[4]],
            [[0]],
            expect=[-600, -600],
        ),
        Call(
            "batch_put_from_multi_buffer_ranges",
            ["s1", "s2"],
            [[Ptr()], [Ptr()]],
            [[4, 4], [4]],
            [[0], [0]],
            expect=[-600, 4],
        ),
        Call("batch_put_from_multi_buffer_ranges", ["s1"], [[]], [[]], [[]], expect=[-702]),
        Call(
            "batch_put_from_multi_buffer_ranges",
            ["s1", "s1"],
            [[Ptr()], [Ptr(4)]],
            [[2], [2]],
            [[0], [2]],
            expect=[2, 2],
        ),
        Call("batch_get_session_start", ["s1"], expect=[-703]),  # reserved, not complete
        Call("batch_put_session_end", ["s1", "s2"], expect=[0, 0]),
        Call("get_batch", ["s1", "s2"], expect=[b"0145", b"0123"]),
        # Mooncake reserves the key at the start, so a put in between finds it taken;
        # kvpool's session is local until its end.
        Call("batch_put_session_start", ["pp"], [4], expect=[0]),
        Call("put", "pp", b"abcd", expect=0),
        Call(
            "batch_put_session_end",
            ["pp"],
            expect=[0],
            kvpool=[-705],
            why="a kvpool put session reserves nothing at the master before its end "
            "(the native Store has no reservation without a write), so the put in between won",
        ),
        Call(
            "get",
            "pp",
            expect=b"\x00\x00\x00\x00",
            kvpool=b"abcd",
            why="the put made during the session wrote the object (see the row above)",
        ),
    ],
    "get_sessions": [
        Call("put", "r1", b"012389AB", expect=0),
        Call("register_buffer", Ptr(), ARENA, expect=0),
        Call(
            "batch_get_into_multi_buffer_ranges",
            ["r1"],
            [[Ptr(100), Ptr(200)]],
            [[2, 3]],
            [[1, 5]],
            expect=[-600],  # no session
        ),
        Peek(100, b"\x00\x00"),
        Call("batch_get_session_start", ["r1", "nope"], expect=[0, -704]),
        Call(
            "batch_get_into_multi_buffer_ranges",
            ["r1", "nope"],
            [[Ptr(300), Ptr(400)], [Ptr(500)]],
            [[2, 3], [1]],
            [[1, 5], [0]],
            expect=[5, -600],
        ),
        Peek(300, b"12\x00"),
        Peek(400, b"9AB\x00"),
        Call(
            "batch_get_into_multi_buffer_ranges", ["r1"], [[Ptr(300)]], [[4]], [[6]], expect=[-600]
        ),
        Call(
            "batch_get_into_multi_buffer_ranges",
            ["r1"],
            [[Foreign()]],
            [[4]],
            [[0]],
            expect=[4],
            kvpool=[-600],
            why="kvpool never writes to an address outside every registered buffer",
        ),
        Call(
            "batch_get_into_multi_buffer_ranges",
            ["r1", "nope"],
            [[Ptr()]],
            [[4]],
            [[0]],
            expect=[-600, -600],
        ),
        Call(
            "batch_get_into_multi_buffer_ranges",
            ["r1"],
            [[Ptr(), Ptr(8)]],
            [[4]],
            [[0]],
            expect=[-600],
        ),
        Call("batch_get_into_multi_buffer_ranges", ["r1"], [[]], [[]], [[]], expect=[0]),
        Call("batch_get_into_multi_buffer_ranges", ["r1"], [[Ptr()]], [[0]], [[0]], expect=[0]),
        Call("batch_get_session_end", ["r1", "nope"], expect=0),
        Call("batch_get_session_end", ["r1"], expect=0),
        Call("remove", "r1", expect=-706),  # the session's lookup granted a lease
    ],
    "other_setup_paths": [
        Call("init_all", "tcp", "", 1 << 20, expect=-600),  # already set up
        Call("put", "k1", b"still set up", expect=0),
        Call("get", "k1", expect=b"still set up"),
    ],
    "health_and_close": [
        Call("health_check", expect=0),
        Call("close", expect=0),
        Call("close", expect=0),
        Call("health_check", expect=1),
        Call("get", "k1", expect=b""),
        Call(
            "put_from",
            "k1",
            Foreign(),
            10,
            expect=-600,
            kvpool=-1010,
            why="every call on a closed store answers UNAVAILABLE_IN_CURRENT_STATUS in kvpool; "
            "Mooncake answers -600 here and crashes on most other calls",
        ),
    ],
}


# --------------------------------------------------------------------------------------------
# The runner


class _Run:
    """Resolves the table's symbols for one backend and checks each step."""

    def __init__(self, backend: Any, store: Any) -> None:
        self.backend = backend
        self.store = store
        self.arena = ctypes.create_string_buffer(ARENA)
        self.foreign = ctypes.create_string_buffer(4096)

    def resolve(self, v: Any) -> Any:
        if isinstance(v, Ptr):
            return ctypes.addressof(self.arena) + v.offset
        if isinstance(v, Foreign):
            return ctypes.addressof(self.foreign) + v.offset
        if isinstance(v, Arr2D):
            return np.zeros((2, 2), dtype=np.uint8)
        if isinstance(v, Cfg):
            mod = self.backend.module
            cfg = mod.ReplicateConfig()
            for k, x in v.fields.items():
                if k == "soft_pin_action":
                    setattr(cfg, k, getattr(mod.SoftPinAction, x))
                elif k == "data_type":
                    setattr(cfg, k, getattr(mod.ObjectDataType, x))
                else:
                    setattr(cfg, k, x)
            return cfg
        if isinstance(v, list):
            return [self.resolve(x) for x in v]
        return v

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        fn: Callable[..., Any] = getattr(self.store, method)
        return fn(*(self.resolve(a) for a in args))

    def check(self, got: Any, expect: Any, what: str) -> None:
        if expect is NEG:
            assert isinstance(got, int) and got < 0, f"{what}: {got!r} is not a negative int"
        elif isinstance(expect, Handle):
            assert got is not None, f"{what}: got None"
            assert len(got) == len(expect.data) and got.size() == len(expect.data), what
            assert got.ptr() != 0, what
            assert bytes(memoryview(got)) == expect.data, what
        elif isinstance(expect, Replicas):
            assert isinstance(got, list) and len(got) == len(expect.sizes), f"{what}: {got!r}"
            for desc, size in zip(got, expect.sizes, strict=True):
                assert desc.status == self.backend.module.ReplicaStatus.COMPLETE, what
                assert desc.is_memory_replica() and not desc.is_disk_replica(), what
                where = desc.get_memory_descriptor().buffer_descriptor
                assert where.size == size, f"{what}: size {where.size}"
                assert where.transport_endpoint == self.store.get_hostname(), what
                assert isinstance(where.buffer_address, int), what
                with pytest.raises(RuntimeError):
                    desc.get_disk_descriptor()
        elif isinstance(expect, ReplicaMap):
            assert isinstance(got, dict) and sorted(got) == sorted(expect.items), what
            for key, replicas in expect.items.items():
                self.check(got[key], replicas, f"{what}[{key}]")
        elif isinstance(expect, Handles):
            assert len(got) == len(expect.items), what
            for g, e in zip(got, expect.items, strict=True):
                if e is None:
                    assert g is None, what
                else:
                    self.check(g, Handle(e), what)
        else:
            assert got == expect, f"{what}: expected {expect!r}, got {got!r}"
            assert type(got) is type(expect), (
                f"{what}: {type(got).__name__} is not {type(expect).__name__}"
            )

    def step(self, i: int, s: Step) -> None:
        if isinstance(s, Fill):
            ctypes.memmove(ctypes.addressof(self.arena) + s.offset, s.data, len(s.data))
        elif isinstance(s, Peek):
            at = ctypes.addressof(self.arena) + s.offset
            assert ctypes.string_at(at, len(s.data)) == s.data, f"step {i}: arena at {s.offset}"
        elif isinstance(s, Eventually):
            wait_until(
                lambda: self.call(s.method, s.args) == s.expect,
                timeout=20 * 0.5,
                what=f"step {i}: {s.method}{s.args!r} == {s.expect!r}",
            )
        else:
            expect = s.kvpool if self.backend.name == "kvpool" and s.kvpool is not ... else s.expect
            what = f"step {i}: {s.method}{_short(s.args)}"
            if isinstance(expect, Raises):
                with pytest.raises(expect.exc):
                    self.call(s.method, s.args)
            else:
                self.check(self.call(s.method, s.args), expect, what)


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) < 120 else text[:117] + "..."


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario(backend: Any, scenario: str) -> None:
    store = backend.store()
    # A clean namespace: the master is shared by the module's tests, whose stores are closed.
    assert store.remove_all(True) >= 0
    run = _Run(backend, store)
    for i, s in enumerate(SCENARIOS[scenario]):
        run.step(i, s)


def test_every_kvpool_difference_says_why() -> None:
    for name, steps in SCENARIOS.items():
        for s in steps:
            if isinstance(s, Call) and s.kvpool is not ...:
                assert s.why, f"{name}: {s.method} differs without a reason"
