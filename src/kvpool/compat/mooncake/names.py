"""Segment names, Mooncake's and kvpool's, translated both ways for the whole process.

Mooncake names a store's segment after the store, "host:port" (what `get_hostname()` answers),
and `ReplicateConfig.preferred_segments`, copy and move tasks and replica descriptors use those
names. kvpool names segments "<transfer endpoint>/<n>", one store possibly owning several (the
setup one, and those mounted later). The stores open in this process are known exactly: each
registers its hostname with its segments. A name of another process is translated by kvpool's
convention, "host:port" ↔ "host:port/0". A name that is already kvpool's passes through.
"""

from __future__ import annotations

import threading

__all__ = [
    "add_segment",
    "forget_store",
    "mooncake_name",
    "open_store",
    "pool_names",
    "remove_segment",
]

_segments: dict[str, list[str]] = {}
"""Mooncake hostname of each store open in this process → its kvpool segment names."""
_lock = threading.Lock()


def open_store(hostname: str, segments: list[str]) -> None:
    with _lock:
        _segments[hostname] = list(segments)


def forget_store(hostname: str) -> None:
    with _lock:
        _segments.pop(hostname, None)


def add_segment(hostname: str, segment: str) -> None:
    """One more segment of an open store (mounted after setup)."""
    with _lock:
        names = _segments.get(hostname)
        if names is not None and segment not in names:
            names.append(segment)


def remove_segment(hostname: str, segment: str) -> None:
    with _lock:
        names = _segments.get(hostname)
        if names is not None and segment in names:
            names.remove(segment)


def pool_names(names: list[str]) -> list[str]:
    """kvpool segment names for Mooncake ones (a store of this process → all its segments)."""
    out: list[str] = []
    with _lock:
        for name in names:
            if name in _segments:
                out.extend(_segments[name])
            elif "/" in name:
                out.append(name)  # already a kvpool name
            else:
                out.append(f"{name}/0")
    return out


def mooncake_name(segment: str) -> str:
    """The Mooncake name of a kvpool segment: the inverse of `pool_names` (a store of this
    process → its hostname, "<endpoint>/0" → "<endpoint>", anything else unchanged)."""
    with _lock:
        for hostname, segments in _segments.items():
            if segment in segments:
                return hostname
    endpoint, _, n = segment.rpartition("/")
    return endpoint if endpoint and n == "0" else segment
