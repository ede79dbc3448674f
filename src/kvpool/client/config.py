"""`StoreConfig`: every setting of a `Store`, one frozen, validated dataclass.

`Store(master, segment_size=..., ...)` builds one from its keyword arguments (the Mooncake-like
form); `Store.from_config(config)` takes one made elsewhere (a config file, a test's fixture).
Sizes are bytes (an int, or a string such as "4GiB", converted when the config is made),
durations seconds. Validation raises `InvalidParams` naming the field and the offending value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from kvpool.client.node import DEFAULT_RPC_TIMEOUT_S
from kvpool.client.tasks import DEFAULT_POLL_INTERVAL_S
from kvpool.config import parse_size
from kvpool.errors import InvalidParams

__all__ = ["DEFAULT_TRANSFER_TIMEOUT_S", "PROTOCOLS", "Protocol", "StoreConfig"]

DEFAULT_TRANSFER_TIMEOUT_S: Final = 60.0
"""Seconds before one transfer (a batch's copies, a TCP read or write) gives up."""
Protocol = Literal["auto", "shm", "tcp"]
PROTOCOLS: Final = ("auto", "shm", "tcp")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The settings of one `Store` (Mooncake's `setup`, in Python form)."""

    master: str = "127.0.0.1:50051"
    """"host:port" of the master."""
    segment_size: int = 0
    """Bytes of this process's memory to contribute to the pool at start; 0 for a pure client
    (`Store.mount_segment` adds segments later)."""
    local_buffer_size: int = 0
    """Bytes; accepted for Mooncake compatibility. kvpool needs no staging buffer (values move
    straight between the caller's memory and the segment), so it only has to be a valid size."""
    host: str = "127.0.0.1"
    """The address this process's transfer server binds (only with a segment)."""
    tenant: str = "default"
    """The namespace of every key of the Store."""
    protocol: Protocol = "auto"
    """ "auto" (memcpy / shared memory on this host, TCP otherwise), "shm", or "tcp" (force TCP,
    for benchmarks and tests)."""
    verify_checksum: bool = True
    """Check every read against the xxh3_64 recorded when the value was written."""
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_S
    """Seconds before a control call to the master gives up."""
    transfer_timeout: float = DEFAULT_TRANSFER_TIMEOUT_S
    """Seconds before a transfer gives up."""
    heartbeat_interval: float = 1.0
    """Seconds between Pings to the master (tests shorten it)."""
    cluster_id: str = "kvpool"
    """Must match the master's (checked in the RPC handshake)."""
    task_poll_interval: float = DEFAULT_POLL_INTERVAL_S
    """With a segment, seconds between polls for the replica copy/move tasks the master assigns
    to this process (`kvpool.client.tasks`)."""
    arena_size: int = 64 << 20
    """Bytes of each arena the master lends the Store for puts in one round trip (values up to a
    quarter of it take that path); 0 turns arenas off."""

    def __post_init__(self) -> None:
        # Sizes are normalised to ints here, so that a config read from a file may say "4GiB".
        for name in ("segment_size", "arena_size", "local_buffer_size"):
            object.__setattr__(self, name, parse_size(getattr(self, name), name=name))
        if self.protocol not in PROTOCOLS:
            raise InvalidParams(f"protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if not isinstance(self.tenant, str) or not self.tenant:
            raise InvalidParams(f"tenant: expected a non-empty str, got {self.tenant!r}")
        if not isinstance(self.master, str) or ":" not in self.master:
            raise InvalidParams(f"master: expected 'host:port', got {self.master!r}")
        for name in ("rpc_timeout", "transfer_timeout", "heartbeat_interval", "task_poll_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidParams(f"{name}: {value!r} must be > 0 s")
        object.__setattr__(self, "transfer_timeout", float(self.transfer_timeout))
