"""Store and prefetch policies: which adapters get which keys, and which adapter loads what.

Policies are small strategy classes registered by name (`--l2-store-policy`,
`--l2-prefetch-policy`); a third party adds one with `register_store_policy` /
`register_prefetch_policy`. They run on the controller threads and must not block.

The controller, not the policy, enforces the plan's rules (seed 003): plans must not overlap
(one key is loaded by one adapter) and may only use keys that adapter found; then the plan is
trimmed to the contiguous prefix (`trim_load_plan_to_prefix`), because the engine can only use
a prefix of KV chunks: with {0,1,2,4,5} found, loading 4 and 5 would only waste I/O and memory.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.errors import InvalidParams

__all__ = [
    "AdapterDescriptor",
    "DefaultPrefetchPolicy",
    "DefaultStorePolicy",
    "PrefetchPolicy",
    "SkipL1StorePolicy",
    "SpreadPrefetchPolicy",
    "StorePolicy",
    "create_prefetch_policy",
    "create_store_policy",
    "prefetch_policy_names",
    "register_prefetch_policy",
    "register_store_policy",
    "store_policy_names",
    "trim_load_plan_to_prefix",
    "validate_load_plan",
]


@dataclass(frozen=True, slots=True)
class AdapterDescriptor:
    """What a policy may know about an adapter: its position and its type name."""

    index: int
    type_name: str


class StorePolicy(ABC):
    """Chooses the L2 targets of newly written L1 keys (all of one (model, kv_rank) group)."""

    @abstractmethod
    def select_store_targets(
        self, keys: Sequence[ObjectKey], adapters: Sequence[AdapterDescriptor]
    ) -> dict[int, list[ObjectKey]]:
        """adapter index → keys to store there (a key may go to several adapters)."""

    def select_l1_deletions(self, keys: Sequence[ObjectKey]) -> list[ObjectKey]:
        """Keys to drop from L1 once stored to L2 (default: none, L1 keeps its copy)."""
        return []


class DefaultStorePolicy(StorePolicy):
    """Every key to every adapter; L1 keeps its copy."""

    def select_store_targets(
        self, keys: Sequence[ObjectKey], adapters: Sequence[AdapterDescriptor]
    ) -> dict[int, list[ObjectKey]]:
        return {a.index: list(keys) for a in adapters}


class SkipL1StorePolicy(DefaultStorePolicy):
    """Every key to every adapter, then free L1 (L1 as a write buffer only)."""

    def select_l1_deletions(self, keys: Sequence[ObjectKey]) -> list[ObjectKey]:
        return list(keys)


class PrefetchPolicy(ABC):
    """Chooses which adapter loads each found key."""

    @abstractmethod
    def select_load_plan(
        self,
        keys: Sequence[ObjectKey],
        lookup_results: Mapping[int, Bitmap],
        adapters: Sequence[AdapterDescriptor],
    ) -> dict[int, Bitmap]:
        """adapter index → keys to load from it; non-overlapping, within what it found."""


class DefaultPrefetchPolicy(PrefetchPolicy):
    """Each key from the lowest-indexed adapter that has it (list adapters fastest first)."""

    def select_load_plan(
        self,
        keys: Sequence[ObjectKey],
        lookup_results: Mapping[int, Bitmap],
        adapters: Sequence[AdapterDescriptor],
    ) -> dict[int, Bitmap]:
        taken = Bitmap(len(keys))
        plan: dict[int, Bitmap] = {}
        for idx in sorted(lookup_results):
            mine = lookup_results[idx].without(taken)
            if mine.any():
                plan[idx] = mine
                taken = taken | mine
        return plan


class SpreadPrefetchPolicy(PrefetchPolicy):
    """Keys found in several adapters are dealt round-robin among them (spreads the load)."""

    def select_load_plan(
        self,
        keys: Sequence[ObjectKey],
        lookup_results: Mapping[int, Bitmap],
        adapters: Sequence[AdapterDescriptor],
    ) -> dict[int, Bitmap]:
        plan = {idx: Bitmap(len(keys)) for idx in lookup_results}
        turn = 0
        for i in range(len(keys)):
            holders = [idx for idx in sorted(lookup_results) if lookup_results[idx].test(i)]
            if holders:
                plan[holders[turn % len(holders)]].set(i)
                turn += 1
        return {idx: bm for idx, bm in plan.items() if bm.any()}


def validate_load_plan(
    plan: Mapping[int, Bitmap], lookup_results: Mapping[int, Bitmap], n: int
) -> None:
    """Raise InvalidParams unless plan bitmaps are disjoint, sized n, and within each lookup."""
    seen = Bitmap(n)
    for idx, bm in plan.items():
        found = lookup_results.get(idx)
        if found is None or bm.size != n:
            raise InvalidParams(
                f"load plan names adapter {idx} without a lookup result of size {n}"
            )
        if bm.without(found).any():
            raise InvalidParams(f"load plan for adapter {idx} uses keys that adapter did not find")
        if bm.overlaps(seen):
            raise InvalidParams("load plan assigns a key to more than one adapter")
        seen = seen | bm


def trim_load_plan_to_prefix(plan: Mapping[int, Bitmap], n: int) -> tuple[dict[int, Bitmap], int]:
    """Keep only the contiguous prefix of planned keys: (trimmed plan, prefix length)."""
    union = Bitmap(n)
    for bm in plan.values():
        union = union | bm
    p = union.count_leading_ones()
    trimmed = {idx: bm.prefix(p) for idx, bm in plan.items()}
    return {idx: bm for idx, bm in trimmed.items() if bm.any()}, p


_lock = threading.Lock()
_store_policies: dict[str, type[StorePolicy]] = {
    "default": DefaultStorePolicy,
    "skip_l1": SkipL1StorePolicy,
}
_prefetch_policies: dict[str, type[PrefetchPolicy]] = {
    "default": DefaultPrefetchPolicy,
    "spread": SpreadPrefetchPolicy,
}


def register_store_policy(name: str, cls: type[StorePolicy]) -> None:
    if not isinstance(cls, type) or not issubclass(cls, StorePolicy):
        raise InvalidParams(f"store policy {name!r} must be a StorePolicy subclass, got {cls!r}")
    with _lock:
        _store_policies[name] = cls


def register_prefetch_policy(name: str, cls: type[PrefetchPolicy]) -> None:
    if not isinstance(cls, type) or not issubclass(cls, PrefetchPolicy):
        raise InvalidParams(
            f"prefetch policy {name!r} must be a PrefetchPolicy subclass, got {cls!r}"
        )
    with _lock:
        _prefetch_policies[name] = cls


def store_policy_names() -> list[str]:
    with _lock:
        return sorted(_store_policies)


def prefetch_policy_names() -> list[str]:
    with _lock:
        return sorted(_prefetch_policies)


def create_store_policy(name: str) -> StorePolicy:
    with _lock:
        cls = _store_policies.get(name)
    if cls is None:
        raise InvalidParams(f"unknown store policy {name!r}; known: {store_policy_names()}")
    return cls()


def create_prefetch_policy(name: str) -> PrefetchPolicy:
    with _lock:
        cls = _prefetch_policies.get(name)
    if cls is None:
        raise InvalidParams(f"unknown prefetch policy {name!r}; known: {prefetch_policy_names()}")
    return cls()
