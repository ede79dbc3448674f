"""Read leases and soft pins: the two deadlines that keep an object from Remove and eviction.

* **Read lease.** Every read (GetReplicaList, ExistKey, GetSize, batch forms) extends
  `lease_deadline` to max(old, now + `default_kv_lease_ttl`); PutEnd extends it to max(old,
  now) (Mooncake's `GrantReadLease(0)`). While `now < lease_deadline` the object is leased:
  Remove answers OBJECT_HAS_LEASE unless forced, RemoveAll and RemoveByRegex skip it, and
  reclaim must not evict it. The hot read paths inline `grant_read_lease` for speed.
* **Soft pin.** A put asks with `soft_pin_action`: PRESERVE (keep what the object has; a new
  object has none), ENABLE (pin for `soft_pin_ttl_ms`, or `default_kv_soft_pin_ttl` when
  absent, at most `max_kv_soft_pin_ttl`), DISABLE (unpin). A TTL with PRESERVE or DISABLE is
  INVALID_PARAMS. The pin runs from the moment the object becomes readable (PutEnd) and reads do
  not extend it; it only lowers eviction priority (reclaim's business). A hard pin
  (`with_hard_pin`) means never evicted, yet still removable.
"""

from __future__ import annotations

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.metadata import ObjectMeta
from kvpool.protocol.messages import ReplicateConfigMsg, SoftPinAction

__all__ = ["grant_read_lease", "is_leased", "resolve_soft_pin"]

# Every put resolves its soft pin: module constants, not `Enum.MEMBER` (a call through
# EnumType.__getattr__ on Python 3.11; docs/parts/perf-master.md).
_ENABLE = SoftPinAction.ENABLE
_OK = ErrorCode.OK
_INVALID = ErrorCode.INVALID_PARAMS


def resolve_soft_pin(
    cfg: ReplicateConfigMsg, config: MasterConfig
) -> tuple[ErrorCode, float | None]:
    """(code, soft-pin TTL in seconds or None for no pin) of a put's config."""
    action = cfg.soft_pin_action
    ttl_ms = cfg.soft_pin_ttl_ms
    if action is _ENABLE:
        if ttl_ms is None:
            ttl = config.default_kv_soft_pin_ttl
        elif ttl_ms < 0 or ttl_ms / 1000.0 > config.max_kv_soft_pin_ttl:
            return _INVALID, None
        else:
            ttl = ttl_ms / 1000.0
        # A zero TTL is an ordinary cache object (Mooncake: "0 means ordinary cache").
        return _OK, (ttl if ttl > 0 else None)
    if ttl_ms is not None:
        # PRESERVE and DISABLE carry no TTL; one given is a caller's mistake, not ignored.
        return _INVALID, None
    return _OK, None


def grant_read_lease(obj: ObjectMeta, now: float, ttl: float) -> None:
    """lease = max(lease, now + ttl)."""
    obj.lease_deadline = max(obj.lease_deadline, now + ttl)


def is_leased(obj: ObjectMeta, now: float) -> bool:
    """Whether a read lease still protects `obj` (expired when now >= deadline, as Mooncake)."""
    return now < obj.lease_deadline
