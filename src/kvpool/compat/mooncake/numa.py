"""`bind_to_numa_node(node)`: Mooncake's module function, as the wheel answers it.

The wheel binds the calling thread to the CPUs of `node` and prefers that node's memory for its
allocations (libnuma's `numa_run_on_node` and `numa_set_preferred`), answers None whatever
happens, and logs a warning for a node that does not exist or a binding that fails. LMCache
calls it before `setup()` when it knows the GPU's NUMA node
(lmcache/v1/storage_backend/connector/mooncakestore_connector.py).

Here: libnuma through ctypes when the system has it; else the thread's CPU affinity only
(`os.sched_setaffinity` to the node's cpulist), with one warning that the memory preference is
not set. A value that is not an int raises TypeError, as pybind11 does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from pathlib import Path

__all__ = ["bind_to_numa_node", "online_nodes"]

log = logging.getLogger(__name__)

_NODE_DIR = Path("/sys/devices/system/node")
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(what: str, message: str, *args: object) -> None:
    with _warn_lock:
        if what in _warned:
            return
        _warned.add(what)
    log.warning(message, *args)


def _parse_list(text: str) -> list[int]:
    """ "0-3,8,10-11" → [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist / node list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def online_nodes() -> list[int]:
    """The NUMA nodes of this machine ([0] when the kernel does not say)."""
    try:
        return _parse_list((_NODE_DIR / "online").read_text())
    except (OSError, ValueError):
        return [0]


def _libnuma() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("numa")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        return lib if lib.numa_available() >= 0 else None
    except (OSError, AttributeError):
        return None


def bind_to_numa_node(node: int) -> None:
    """Bind the calling thread, and its memory preference, to NUMA node `node` (module
    docstring). None; a warning when it cannot."""
    if isinstance(node, bool) or not isinstance(node, int):
        raise TypeError(f"bind_to_numa_node(): node must be an int, got {type(node).__name__}")
    nodes = online_nodes()
    if node not in nodes:
        log.warning("Invalid NUMA node: %d. Valid nodes: %s", node, nodes)
        return
    lib = _libnuma()
    if lib is not None:
        if lib.numa_run_on_node(ctypes.c_int(node)) != 0:
            log.warning("numa_run_on_node failed for node %d", node)
            return
        lib.numa_set_preferred(ctypes.c_int(node))
        return
    try:
        cpus = _parse_list((_NODE_DIR / f"node{node}" / "cpulist").read_text())
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError) as exc:
        _warn_once("affinity", "bind_to_numa_node(%d): cannot bind the thread: %s", node, exc)
        return
    _warn_once(
        "libnuma",
        "bind_to_numa_node(%d): libnuma is not installed; the thread is bound to the node's "
        "CPUs, its memory is not",
        node,
    )
