"""`SegmentLocation`: everything the engine needs to reach one segment, local or remote.

The client builds it from the master's `SegmentInfo`; the engine caches it per segment name and
drops it (`TransferEngine.forget`) when the owner is gone or the segment was remounted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.errors import InvalidParams

__all__ = ["SegmentLocation", "normalize_segment_name", "parse_endpoint"]

MAX_SEGMENT_NAME = 200
"""Bytes of UTF-8; the memfd name (max 249 bytes) carries the segment name for verification."""


@dataclass(frozen=True, slots=True)
class SegmentLocation:
    """Where segment `name` lives: its size, its owner's machine, transfer server and shm path."""

    name: str
    size: int
    host_id: str
    endpoint: str
    """`host:port` of the owner's `TransferServer` ("" when it serves no TCP)."""
    shm_path: str = ""
    """What a same-host peer opens and maps ("" when the segment is not shareable)."""

    def __post_init__(self) -> None:
        if self.size <= 0:
            raise InvalidParams(f"SegmentLocation {self.name!r}: size must be > 0, got {self.size}")
        if not self.endpoint and not self.shm_path:
            raise InvalidParams(f"SegmentLocation {self.name!r}: neither endpoint nor shm_path")


def normalize_segment_name(name: object) -> str:
    """The name without leading '/', validated (Mooncake's openSegment rule)."""
    if not isinstance(name, str):
        raise InvalidParams(f"segment name must be a str, got {type(name).__name__}")
    stripped = name.lstrip("/")
    if not stripped:
        raise InvalidParams(f"segment name {name!r} is empty")
    if "\x00" in stripped or len(stripped.encode()) > MAX_SEGMENT_NAME:
        raise InvalidParams(f"segment name {name!r} has a NUL or is over {MAX_SEGMENT_NAME} bytes")
    return stripped


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) from "host:port" (IPv6 as "[::1]:port")."""
    host, sep, port_s = endpoint.rpartition(":")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise InvalidParams(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port_s)
