"""`LeaderView`: who leads a cluster, where it serves, and in which term.

The value of the leader key (`kvpool.ha.keys`), JSON so that `etcdctl get` shows it. Terms
strictly increase across leaders (each campaign takes the term key's value plus one in the same
transaction that creates the leader key), so of two views the one with the higher term is the
newer; a caller that has seen term T refuses any answer from a term below T.
"""

from __future__ import annotations

import msgspec

from kvpool.ha.coordinator import CoordinatorError

__all__ = ["LeaderView"]


class LeaderView(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """A leader: its member id, the address it serves clients on ("HOST:PORT"), its term."""

    member_id: str
    address: str
    term: int

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> LeaderView:
        """The view in `data`; `CoordinatorError` when it is not one."""
        try:
            view = msgspec.json.decode(data, type=cls)
        except msgspec.DecodeError as exc:
            raise CoordinatorError(f"not a kvpool leader record: {data[:200]!r} ({exc})") from exc
        if view.term < 1:
            raise CoordinatorError(f"leader record with term {view.term} (terms start at 1)")
        return view

    def newer_than(self, other: LeaderView | None) -> bool:
        """Whether this view should replace `other` (a higher term; anything beats None)."""
        return other is None or self.term > other.term
