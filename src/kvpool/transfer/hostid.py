"""`host_id()`: which machine (and which process name space) this process runs on.

Two processes may share memory through `/proc/<pid>/fd/<fd>` only when they run on the same
kernel *and* see the same pid name space; two containers on one host share the boot id but not
their pids. So the id hashes the kernel's boot id, the host name and the inode of this process's
pid name space. Equal ids mean "a peer's `shm_path` names the peer's memory here"; the engine
still verifies what it opened (see `kvpool.transfer.memory.open_peer_mapping`), so a false match
falls back to TCP instead of mapping the wrong memory.
"""

from __future__ import annotations

import functools
import os
import socket

import xxhash

__all__ = ["host_id"]


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


@functools.cache
def host_id() -> str:
    """A 16-hex-digit id, stable for the life of this boot, equal for processes that can map
    each other's segments."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    parts = f"{boot}|{socket.gethostname()}|{_pid_namespace()}"
    return xxhash.xxh3_64_hexdigest(parts.encode())
