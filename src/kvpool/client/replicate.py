"""`ReplicateConfig`: how many replicas a put makes, where, and how it is protected from eviction.

This is the user-facing form of the wire message `ReplicateConfigMsg`. It is validated once, when
it is built, with the offending value in the error, so a bad config never reaches the master;
`to_msg()` converts it (cached per instance, since the same config is usually reused for every
put). Fields and defaults follow Mooncake's `ReplicateConfig`:

* `replica_num`: memory replicas, placed on distinct segments (best effort: the master may
  allocate fewer when fewer segments exist).
* `soft_pin_action` / `soft_pin_ttl_ms`: ENABLE pins the object for a TTL (None: the master's
  default); PRESERVE keeps what an upsert's object had; DISABLE clears it. A TTL with PRESERVE or
  DISABLE is INVALID_PARAMS, as in Mooncake.
* `with_hard_pin`: never evicted.
* `preferred_segments`: segment names tried first; `prefer_alloc_in_same_node`: prefer segments on
  this host.
* `group_ids`: one group per key of a batch (annotation only; routing never depends on it).
* `dfs_replica_num`: 1 for a copy in the shared DFS directory (`kvpool master --dfs-root`) as
  well, written by this client (docs/parts/tiers.md); one-value puts only.

Pins are enforced by the master's eviction; the client accepts and forwards them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.config import MAX_DURATION_S
from kvpool.errors import InvalidParams
from kvpool.protocol.messages import ReplicateConfigMsg, SegmentName, SoftPinAction

__all__ = ["ReplicateConfig", "SoftPinAction"]

MAX_REPLICAS = 64
"""More replicas than this is certainly a mistake (a pool has far fewer segments)."""
MAX_SOFT_PIN_TTL_MS = int(MAX_DURATION_S * 1000)
"""No master takes a longer soft pin (`kvpool.config.MAX_DURATION_S`)."""


@dataclass(frozen=True, slots=True)
class ReplicateConfig:
    """Placement and protection of the objects written by one put (see the module docstring)."""

    replica_num: int = 1
    """Memory replicas to write, on distinct segments (>= 1)."""
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    """ENABLE, PRESERVE or DISABLE the soft pin."""
    soft_pin_ttl_ms: int | None = None
    """Soft-pin TTL in ms (ENABLE only; None: the master's default)."""
    with_hard_pin: bool = False
    """Never evict these objects."""
    preferred_segments: tuple[str, ...] = ()
    """Segment names to try first."""
    prefer_alloc_in_same_node: bool = False
    """Prefer segments on this client's host."""
    group_ids: tuple[str, ...] | None = None
    """One group id per key (batch puts), or None."""
    dfs_replica_num: int = 0
    """Copies in the master's DFS directory (0 or 1)."""
    _msg: ReplicateConfigMsg | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.replica_num, bool) or not isinstance(self.replica_num, int):
            raise InvalidParams(f"replica_num: expected an int, got {self.replica_num!r}")
        if not 1 <= self.replica_num <= MAX_REPLICAS:
            raise InvalidParams(f"replica_num: {self.replica_num} is outside 1..{MAX_REPLICAS}")
        action: object = self.soft_pin_action
        if isinstance(action, str):
            try:
                action = SoftPinAction[action.upper()]
            except KeyError:
                raise InvalidParams(f"soft_pin_action: unknown action {action!r}") from None
            object.__setattr__(self, "soft_pin_action", action)
        if not isinstance(action, SoftPinAction):
            raise InvalidParams(f"soft_pin_action: expected a SoftPinAction, got {action!r}")
        ttl = self.soft_pin_ttl_ms
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
                raise InvalidParams(f"soft_pin_ttl_ms: expected an int >= 0 or None, got {ttl!r}")
            if ttl > MAX_SOFT_PIN_TTL_MS:
                raise InvalidParams(
                    f"soft_pin_ttl_ms: {ttl} ms is above the maximum of {MAX_SOFT_PIN_TTL_MS} ms "
                    "(a year; the master's own limit, --max-kv-soft-pin-ttl, is 24h by default)"
                )
            if action is not SoftPinAction.ENABLE:
                raise InvalidParams(
                    f"soft_pin_ttl_ms={ttl} needs soft_pin_action=ENABLE, not {action.name}"
                )
        if not isinstance(self.with_hard_pin, bool):
            raise InvalidParams(f"with_hard_pin: expected a bool, got {self.with_hard_pin!r}")
        if not isinstance(self.prefer_alloc_in_same_node, bool):
            raise InvalidParams(
                f"prefer_alloc_in_same_node: expected a bool, got {self.prefer_alloc_in_same_node!r}"
            )
        object.__setattr__(
            self, "preferred_segments", _names("preferred_segments", self.preferred_segments)
        )
        if self.group_ids is not None:
            object.__setattr__(self, "group_ids", _names("group_ids", self.group_ids))
        dfs = self.dfs_replica_num
        if isinstance(dfs, bool) or not isinstance(dfs, int) or dfs not in (0, 1):
            raise InvalidParams(f"dfs_replica_num: expected 0 or 1, got {dfs!r}")

    def to_msg(self) -> ReplicateConfigMsg:
        """The wire form (built once per config and reused by every put that passes it)."""
        msg = self._msg
        if msg is None:
            msg = ReplicateConfigMsg(
                replica_num=self.replica_num,
                soft_pin_action=self.soft_pin_action,
                soft_pin_ttl_ms=self.soft_pin_ttl_ms,
                with_hard_pin=self.with_hard_pin,
                preferred_segments=[SegmentName(s) for s in self.preferred_segments],
                prefer_alloc_in_same_node=self.prefer_alloc_in_same_node,
                group_ids=list(self.group_ids) if self.group_ids is not None else None,
                dfs_replica_num=self.dfs_replica_num,
            )
            object.__setattr__(self, "_msg", msg)
        return msg

    def check_batch(self, n_keys: int) -> None:
        """Refuse group ids that do not give exactly one group per key (Mooncake: INVALID_PARAMS)."""
        if self.group_ids is not None and len(self.group_ids) != n_keys:
            raise InvalidParams(
                f"group_ids: {len(self.group_ids)} group ids for {n_keys} keys (need one per key)"
            )


def _names(what: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidParams(f"{what}: expected a list of strings, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidParams(f"{what}: expected non-empty strings, got {item!r}")
    return tuple(value)


DEFAULT_CONFIG = ReplicateConfig()
