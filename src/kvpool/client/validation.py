"""What the Store checks: its caller's input before anything is sent, and batch answers.

Bad input raises `InvalidParams` naming the argument and the value; nothing reaches the master or
a segment. Keys are non-empty `str` of at most MAX_KEY_BYTES bytes; values are non-empty buffers
(anything with the buffer protocol); a write batch may not name a key twice; a `put_from` /
`get_into` buffer must lie inside memory registered with `register_buffer`.

A batch answer of the master with a number of entries other than the keys asked raises
`RpcError` (RPC_FAIL): `check_count`, used wherever the Store pairs answers with keys.

The batch checks run once per key of every batch, so they stay plain: one comprehension picks
the suspicious keys, and only those take the full check.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Final

from kvpool.client.replicate import ReplicateConfig
from kvpool.config import format_size
from kvpool.errors import ErrorCode, InvalidParams, RpcError
from kvpool.transfer.registration import MemoryRegistry, buffer_address, byte_view

__all__ = [
    "MAX_KEY_BYTES",
    "Buffer",
    "batch_views",
    "check_count",
    "check_key",
    "check_keys",
    "check_name",
    "check_names",
    "check_pattern",
    "check_replicate_config",
    "check_segment_size",
    "check_values",
    "physical_memory",
    "registered",
    "registered_view",
    "registered_views",
    "value_view",
]

MAX_KEY_BYTES: Final = 4096
"""Longer keys are refused (INVALID_PARAMS): keys are names, not payloads."""

Buffer = object
"""Anything with the buffer protocol (bytes, bytearray, memoryview, numpy array, mmap, ...)."""


def check_key(key: object) -> str:
    """`key` when it is a non-empty str of at most MAX_KEY_BYTES bytes."""
    if not isinstance(key, str):
        raise InvalidParams(f"key: expected a str, got {type(key).__name__}")
    if not key:
        raise InvalidParams("key: the empty string is not a key")
    if len(key) > MAX_KEY_BYTES // 4 and len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidParams(f"key: {len(key.encode())} bytes, over the {MAX_KEY_BYTES}-byte limit")
    return key


def check_keys(keys: object, *, unique: bool) -> list[str]:
    """`keys` as a list, each a valid key; with `unique` (write batches) none twice."""
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise InvalidParams(f"keys: expected a list of str, got {type(keys).__name__}")
    out = list(keys)
    # One comprehension for the whole batch; only suspicious keys take the full check.
    limit = MAX_KEY_BYTES // 4
    for k in [k for k in out if type(k) is not str or not k or len(k) > limit]:
        check_key(k)
    if unique and len(set(out)) != len(out):
        raise InvalidParams("keys: a write batch names the same key twice")
    return out


def value_view(value: object, what: str = "value") -> memoryview:
    """The bytes of a value to put, as a flat memoryview (never empty)."""
    if type(value) is bytes and value:  # flat bytes already: skip byte_view's checks
        return memoryview(value)
    mv = byte_view(value, what=what)
    if mv.nbytes == 0:
        raise InvalidParams(f"{what}: zero-length values are not stored")
    return mv


def registered(
    registry: MemoryRegistry, buffer: Buffer, *, writable: bool, what: str
) -> memoryview:
    """The bytes of `buffer` when they lie inside memory registered in `registry`."""
    mv = byte_view(buffer, writable=writable, what=what)
    if mv.nbytes == 0:
        raise InvalidParams(f"{what}: the buffer is empty")
    if registry.find(buffer_address(mv), mv.nbytes) is None:
        raise InvalidParams(
            f"{what}: {mv.nbytes} bytes at {buffer_address(mv):#x} are not inside memory "
            "registered with register_buffer()"
        )
    return mv


def registered_view(
    registry: MemoryRegistry, b: Buffer, *, writable: bool, what: str
) -> memoryview:
    """`registered_views` of one buffer (`get_into`, `put_from`), without the list."""
    if (
        type(b) is memoryview
        and id(b.obj) in registry.pinned
        and b.c_contiguous
        and b.nbytes
        and b.ndim == 1
        and b.format == "B"
        and not (writable and b.readonly)
    ):
        return b
    return registered(registry, b, writable=writable, what=what)


def registered_views(
    registry: MemoryRegistry, buffers: Sequence[Buffer], *, writable: bool, what: str
) -> list[memoryview]:
    """`registered` of each buffer. A flat byte memoryview cut from a pinned exporter
    (`MemoryRegistry.pinned`: a registered memoryview of all of it) is inside registered
    memory wherever it starts, so it passes with one dict lookup and no address taken; the
    rest take `registered`'s full check."""
    pinned = registry.pinned
    out = [
        b
        if type(b) is memoryview
        and id(b.obj) in pinned
        and b.c_contiguous
        and b.nbytes
        and b.ndim == 1
        and b.format == "B"
        and not (writable and b.readonly)
        else registered(registry, b, writable=writable, what=what)
        for b in buffers
    ]
    return out


def batch_views(
    keys: list[str], values: Sequence[Buffer], view: Callable[[Buffer], memoryview]
) -> list[memoryview]:
    """One view per key (`view` of each value), when `values` pairs up with `keys`."""
    check_values(keys, values)
    return [view(v) for v in values]


def check_values(keys: list[str], values: object) -> Sequence[Buffer]:
    """`values` when it is a list of buffers (not yet checked one by one) as long as `keys`."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidParams(f"values: expected a list of buffers, got {type(values).__name__}")
    if len(values) != len(keys):
        raise InvalidParams(f"{len(keys)} keys but {len(values)} values")
    return values


def check_pattern(pattern: object) -> str:
    """`pattern` when the master can compile it: the master matches keys with the `regex`
    package (a time limit per chunk of keys), so it is `regex` that checks it here too
    (`re` refuses valid patterns such as `\\p{L}`)."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidParams(f"pattern: expected a non-empty regular expression, got {pattern!r}")
    import regex  # type: ignore[import-untyped]  # only this call needs it: not at import

    try:
        regex.compile(pattern)
    except (regex.error, ValueError, TypeError, OverflowError) as exc:
        raise InvalidParams(f"pattern {pattern!r}: {exc}") from exc
    return pattern


def check_name(value: object, what: str) -> str:
    """A non-empty str (a key or a segment name), else INVALID_PARAMS naming `what`."""
    if not isinstance(value, str) or not value:
        raise InvalidParams(f"{what}: expected non-empty str, got {value!r}")
    return value


def check_names(values: object, what: str) -> list[str]:
    """A list of `check_name`s (a str itself is refused: it is not a list of names)."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise InvalidParams(f"{what}: expected a list of str, got {type(values).__name__}")
    return [check_name(v, what) for v in values]


def check_replicate_config(config: object) -> ReplicateConfig | None:
    """`config` when it is a `ReplicateConfig` or None (a dict or anything else is refused:
    `ReplicateConfig(**d)` builds one from a dict)."""
    if config is None or type(config) is ReplicateConfig or isinstance(config, ReplicateConfig):
        return config
    raise InvalidParams(
        f"config: expected a kvpool.ReplicateConfig or None, got {type(config).__name__} "
        f"{config!r:.80}"
    )


def physical_memory() -> int:
    """Bytes of RAM of this machine (0 when the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def check_segment_size(size: int, what: str = "segment_size") -> int:
    """`size` when this machine can hold a memory segment that large: a segment is pre-faulted
    memory (`kvpool.transfer.memory`), so one larger than the RAM can never be created."""
    total = physical_memory()
    if total and size > total:
        raise InvalidParams(
            f"{what}: {format_size(size)} ({size} bytes) is more than this machine's memory "
            f"({format_size(total)}); a segment is memory, pre-faulted when it is created"
        )
    return size


def check_count(what: str, got: int, want: int) -> None:
    """A batch answer must have one entry per key asked: anything else is a fault of the master
    or the connection (RPC_FAIL), never a value to zip with the keys."""
    if got != want:
        raise RpcError(f"{what} answered {got} results for {want} keys", ErrorCode.RPC_FAIL)
