"""How a Mooncake call answers: its arguments checked as pybind11 checks them, its faults as codes.

Mooncake's store is a pybind11 class, so its Python-level misuse is the only thing that raises:
an argument of the wrong type is a `TypeError` before anything runs. Everything that goes wrong
after that (a closed store, a refused put, a dead master) is an answer: a negative code, `b""`,
`None`, an empty list, shaped by the call. The checks here raise the first kind; `answers` turns
the second kind into the call's answer, once for every method (docs/compat.md lists the answers
call by call).
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, TypeVarTuple

from kvpool.client import Store
from kvpool.codes import INTERNAL_ERROR, UNAVAILABLE_IN_CURRENT_STATUS
from kvpool.errors import KVPoolError

__all__ = [
    "HasStore",
    "answers",
    "as_code",
    "check_key",
    "check_keys",
    "check_names",
    "check_str",
    "index",
    "join_parts",
    "one_code",
    "per_key",
    "unsigned",
    "view",
]

log = logging.getLogger(__name__)


class HasStore(Protocol):
    """What `answers` needs of a compat store: its native Store, None when not set up."""

    _store: Store | None


Ts = TypeVarTuple("Ts")
R = TypeVar("R")
S = TypeVar("S", bound=HasStore)


def as_code(exc: BaseException) -> int:
    """The Mooncake code of a fault: a kvpool error's own code, else INTERNAL_ERROR (logged:
    an exception that is not a `KVPoolError` is a bug of this layer)."""
    if isinstance(exc, KVPoolError):
        return int(exc.code)
    log.error("unexpected error in the Mooncake compatibility layer", exc_info=exc)
    return INTERNAL_ERROR


def answers(
    fault: Callable[..., R],
) -> Callable[[Callable[[S, Store, *Ts], R]], Callable[[S, *Ts], R]]:
    """Run a method body on the store's native `Store`, answering `fault(code, *args)` when
    the store is not set up (UNAVAILABLE_IN_CURRENT_STATUS, -1010) or the body raises.

    The body takes the native `Store` after `self`; callers pass the other arguments
    positionally (keywords would cost a dict per call on the put path), already checked (a
    `TypeError` of a check must raise before the store is looked at, as pybind11's does). ::

        @answers(one_code)
        def _remove(self, store: Store, key: str, force: bool) -> int: ...
    """

    def decorate(body: Callable[[S, Store, *Ts], R]) -> Callable[[S, *Ts], R]:
        def run(self: S, /, *args: *Ts) -> R:
            store = self._store
            if store is None:
                return fault(UNAVAILABLE_IN_CURRENT_STATUS, *args)
            try:
                return body(self, store, *args)
            except Exception as exc:
                return fault(as_code(exc), *args)

        functools.update_wrapper(run, body)
        return run

    return decorate


def one_code(code: int, *_: object) -> int:
    """The fault answer of a call that answers one int."""
    return code


def per_key(code: int, keys: Sequence[object], *_: object) -> list[int]:
    """The fault answer of a batch call: the code once per key (its first argument)."""
    return [code] * len(keys)


def check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"key: expected str, got {type(key).__name__}")
    return key


def check_keys(keys: object) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys: expected a list of str, got {type(keys).__name__}")
    return [check_key(k) for k in keys]


def check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected str, got {type(value).__name__}")
    return value


def check_names(names: object, what: str) -> list[str]:
    """Segment names: a list of str (TypeError otherwise, as pybind11); empty names dropped."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"{what}: expected a list of str, got {type(names).__name__}")
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what}: expected str")
    return [n for n in names if n]


def index(value: object) -> int:
    """An integer argument (a pointer, a size): TypeError for anything else."""
    return operator.index(value)  # type: ignore[arg-type]  # TypeError for non-integers


def unsigned(value: object, what: str) -> int:
    """An int >= 0 (TypeError otherwise, as pybind11 answers for its unsigned arguments)."""
    n = index(value)
    if n < 0:
        raise TypeError(f"{what}: expected an int >= 0, got {n}")
    return n


def view(value: object) -> memoryview:
    """A byte view of `value` (TypeError without the buffer protocol, as pybind11's Buffer)."""
    mv = memoryview(value)  # type: ignore[arg-type]  # raises TypeError for non-buffers
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B") if mv.c_contiguous else mv
    return mv


def join_parts(parts: Sequence[Any]) -> memoryview:
    """One byte view of 1-D buffers, concatenated; RuntimeError for any other part (Mooncake's
    one raising path: "parts must be 1-D bytes-like")."""
    views = []
    for p in parts:
        mv = memoryview(p)
        if mv.ndim != 1:
            raise RuntimeError("parts must be 1-D bytes-like")
        views.append(mv.cast("B") if mv.format != "B" else mv)
    if len(views) == 1:
        return views[0]
    return memoryview(b"".join(views))
