"""Reclaim for the master's memory: Linux-style active/inactive lists, kswapd, direct reclaim.

See README.md in this directory for the lists, the state machine, isolation, kswapd versus
direct reclaim, group commit, and the cache and pool eviction modes. Layers, bottom up:

    records.py   EvictInfo (one per COMPLETE memory replica), ListState
    lists.py     ReclaimLists: one shard's active/inactive lists under its lock, O(1) each op
    base.py      ReclaimTarget (what the engine asks the metadata), Verdict
    config.py    ReclaimConfig, EvictionMode
    engine.py    ReclaimEngine: online hooks, kswapd_step, direct_reclaim (group commit)
    fit.py       RangeReclaimer: evict the neighbours that make one free block of a put's size
    softpin.py   the deadline index that expires soft pins in order, shard by shard
    simulated.py SimulatedPool: an in-memory ReclaimTarget for tests and benchmarks
    adapter.py   MasterReclaimHooks: the master service's reclaim hooks over the engine

Of the rest of the master, only adapter.py (the service's metadata) and config.py (the
master's flags) import anything.
"""

from kvpool.master.reclaim.base import ReclaimTarget, Verdict
from kvpool.master.reclaim.config import EvictionMode, ReclaimConfig
from kvpool.master.reclaim.engine import ReclaimEngine, ReclaimResult, ReclaimStats
from kvpool.master.reclaim.fit import RangeReclaimer
from kvpool.master.reclaim.lists import ReclaimLists
from kvpool.master.reclaim.records import EvictInfo, ListState
from kvpool.master.reclaim.softpin import SoftPinIndex

__all__ = [
    "EvictInfo",
    "EvictionMode",
    "ListState",
    "RangeReclaimer",
    "ReclaimConfig",
    "ReclaimEngine",
    "ReclaimLists",
    "ReclaimResult",
    "ReclaimStats",
    "ReclaimTarget",
    "SoftPinIndex",
    "Verdict",
]
