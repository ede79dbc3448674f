"""The sizes, deadlines and tolerances of one `kvpool bench fuzz` run (`kvpool.bench.fuzz`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvpool.rpc.server import DEFAULT_MAX_CONNECTIONS_PER_PEER

__all__ = ["MiB", "Plan", "Tolerance"]

MiB: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes and deadlines of one run."""

    frames: int = 1_000_000
    """Frames to send in all (both targets), unless `seconds` runs out first."""
    seconds: float = 120.0
    seed: int = 15
    segment_size: int = 64 * MiB
    idle_timeout_s: float = 10.0
    """The servers' idle limits (master `--rpc-idle-timeout`, node `--transfer-idle-timeout`):
    shorter than their defaults so that the held connections are swept within the run."""
    first_byte_timeout_s: float = 10.0
    """The servers' handshake and first-request limits (master `--rpc-handshake-timeout`, node
    `--transfer-first-request-timeout`), twice their defaults: the whole flood must be open
    before any of it expires, or its expiries free room under the cap even on a loaded machine."""
    per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    """Both servers' per-peer connection caps (the defaults), what the flood fills."""
    max_batch: int = 512
    """Frames (requests) one session pipelines at most."""
    max_held: int = 48
    """Half-open connections held at once per target."""
    huge_batch: int = 100_000
    """Keys of the rare huge batch request."""
    warmup_sessions: int = 60
    probe_interval_s: float = 0.5
    hang_s: float = 10.0
    session_deadline_s: float = 10.0
    settle_s: float = 30.0
    """How long to wait for the servers to come back to the baseline after the flood."""

    @staticmethod
    def of(quick: bool, frames: int, seconds: float, seed: int) -> Plan:
        if quick:
            return Plan(
                frames=frames,
                seconds=seconds,
                seed=seed,
                idle_timeout_s=3.0,
                per_peer=128,
                max_batch=128,
                max_held=12,
                huge_batch=4000,  # unchunked (`batch_chunk_keys`): see docs/parts/perf-fuzz.md
                warmup_sessions=30,
                probe_interval_s=0.25,
                settle_s=20.0,
            )
        return Plan(frames=frames, seconds=seconds, seed=seed)


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far from the baseline a server may end (see the module docstring)."""

    rss_mb: float = 12.0
    threads: int = 0
    fds: int = 0
