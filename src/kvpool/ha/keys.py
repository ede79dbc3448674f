"""`ClusterKeys`: where a kvpool cluster keeps its coordination state in etcd.

    /kvpool/<cluster_id>/leader           the leader's `LeaderView` (JSON), on the leader's lease
    /kvpool/<cluster_id>/term             the last term handed out (decimal), no lease: it
                                          outlives every leader, so terms only grow
    /kvpool/<cluster_id>/members/<id>     one per running master, on that master's own lease

Everything of one cluster lives under one prefix, so clusters share an etcd without meeting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvpool.errors import InvalidParams

__all__ = ["ClusterKeys", "validate_name"]

ROOT = "/kvpool"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(kind: str, value: str) -> str:
    """`value` if it is a usable cluster or member id (letters, digits, `.`, `_`, `-`; at most
    128; not starting with a punctuation mark), else `InvalidParams` saying what is wrong."""
    if not _NAME.match(value):
        raise InvalidParams(
            f"{kind} {value!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class ClusterKeys:
    """The etcd keys of cluster `cluster_id` (validated)."""

    cluster_id: str

    def __post_init__(self) -> None:
        validate_name("cluster id", self.cluster_id)

    @property
    def prefix(self) -> bytes:
        return f"{ROOT}/{self.cluster_id}/".encode()

    @property
    def leader(self) -> bytes:
        return self.prefix + b"leader"

    @property
    def term(self) -> bytes:
        return self.prefix + b"term"

    @property
    def in_sync(self) -> bytes:
        """The last leader's record of its standbys in sync (`kvpool.master.ha`), no lease: it
        says who may lead next without losing an acknowledged write."""
        return self.prefix + b"insync"

    @property
    def members(self) -> bytes:
        return self.prefix + b"members/"

    def member(self, member_id: str) -> bytes:
        return self.members + validate_name("member id", member_id).encode()
