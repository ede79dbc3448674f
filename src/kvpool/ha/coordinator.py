"""`Coordinator`: the narrow interface kvpool's high availability needs from etcd.

Election (`kvpool.ha.election`), membership (`kvpool.ha.membership`) and discovery
(`kvpool.ha.discovery`) speak only to this ABC, so the etcd client behind it can be swapped; the
one implementation is `kvpool.ha.gateway.EtcdGateway` (etcd's v3 JSON gateway over the standard
library's HTTP client; docs/parts/ha.md says why it was chosen over a gRPC client).

Contract, for every implementation:

* **Threads.** Every method may be called from any thread, concurrently; each blocks the caller
  for at most its `timeout` (seconds; None: the coordinator's default) plus one connection
  attempt per endpoint.
* **Faults are exceptions, outcomes are values.** etcd that cannot be reached, or does not
  answer in time, raises `CoordinatorUnavailable`; an answer that is an error raises
  `CoordinatorError`. A missing key (`get` → None), a lost lease (`keepalive` → 0), a failed
  compare (`TxnResult.succeeded` False) are outcomes.
* **Revisions.** Every write answers etcd's revision after it; `KeyValue.mod_revision` is 0 for
  nothing, so `ModRevisionIs(key, 0)` means "the key does not exist".
* **Watches** deliver events in revision order from `start_revision` on, on their own thread,
  into a queue that `Watch.get` reads; a watch whose stream ended (etcd restarted, the revision
  was compacted, `close()`) raises `WatchLost` from `get`, and the caller re-reads and watches
  again. `Watch.close()` is idempotent and joins the thread.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

from kvpool.errors import ErrorCode, KVPoolError

__all__ = [
    "Coordinator",
    "CoordinatorError",
    "CoordinatorUnavailable",
    "Delete",
    "EventType",
    "KeyValue",
    "Lease",
    "LeaseId",
    "ModRevisionIs",
    "Put",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "WatchLost",
    "prefix_end",
]

LeaseId = NewType("LeaseId", int)
"""etcd's lease id (a positive 64-bit integer)."""


class CoordinatorError(KVPoolError):
    """etcd answered with an error (or something that is not etcd's answer)."""

    default_code = ErrorCode.ETCD_OPERATION_ERROR


class CoordinatorUnavailable(CoordinatorError):
    """No endpoint of etcd could be reached, or none answered within the timeout."""

    default_code = ErrorCode.ETCD_CTX_CANCELLED


class WatchLost(CoordinatorError):
    """A watch's stream ended; re-read the keys and watch again from the new revision."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd holds it; `lease` is 0 when the key is not attached to a lease."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: LeaseId


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease: its id and the TTL etcd granted (seconds; may exceed the request)."""

    id: LeaseId
    ttl: int


@dataclass(frozen=True, slots=True)
class ModRevisionIs:
    """A transaction's compare: `key`'s mod revision equals `revision` (0: the key is absent)."""

    key: bytes
    revision: int


@dataclass(frozen=True, slots=True)
class Put:
    """A transaction's write of `value` at `key`, attached to `lease` when given."""

    key: bytes
    value: bytes
    lease: LeaseId | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """A transaction's delete of `key` (no error when it is absent)."""

    key: bytes


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a transaction did: whether every compare held (then the writes were applied),
    etcd's revision after it, and on failure the current values of the keys asked for."""

    succeeded: bool
    revision: int
    current: dict[bytes, KeyValue]


class EventType(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change; for DELETE, `kv.value` is empty and `kv.mod_revision` is the deletion's."""

    type: EventType
    kv: KeyValue


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key that starts with `prefix`"."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


class Watch(ABC):
    """A stream of changes under one key or prefix, fed by a thread that the watch owns."""

    @abstractmethod
    def get(self, timeout: float) -> list[WatchEvent] | None:
        """The next batch of events (one revision's worth or more); None after `timeout` s
        with nothing new. Raises `WatchLost` once the stream has ended."""

    @abstractmethod
    def close(self) -> None:
        """Stop the stream and join its thread (idempotent)."""


class Coordinator(ABC):
    """The key-value, lease, transaction and watch operations HA uses (module docstring)."""

    @abstractmethod
    def get(self, key: bytes, *, timeout: float | None = None) -> tuple[KeyValue | None, int]:
        """The key (None when absent) and etcd's revision at the read."""

    @abstractmethod
    def get_prefix(
        self, prefix: bytes, *, timeout: float | None = None
    ) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, sorted by key, and etcd's revision at the read."""

    @abstractmethod
    def put(
        self,
        key: bytes,
        value: bytes,
        *,
        lease: LeaseId | None = None,
        timeout: float | None = None,
    ) -> int:
        """Write `value` (attached to `lease` when given); etcd's revision after it."""

    @abstractmethod
    def delete(self, key: bytes, *, timeout: float | None = None) -> bool:
        """Delete `key`; whether it existed."""

    @abstractmethod
    def txn(
        self,
        compares: Sequence[ModRevisionIs],
        writes: Sequence[Put | Delete],
        *,
        read_on_failure: Sequence[bytes] = (),
        timeout: float | None = None,
    ) -> TxnResult:
        """Apply `writes` atomically if every compare holds; else read `read_on_failure`."""

    def create(
        self,
        key: bytes,
        value: bytes,
        *,
        lease: LeaseId | None = None,
        timeout: float | None = None,
    ) -> TxnResult:
        """Write `key` only if it is absent; on failure `current[key]` is its holder."""
        return self.txn(
            [ModRevisionIs(key, 0)],
            [Put(key, value, lease)],
            read_on_failure=[key],
            timeout=timeout,
        )

    @abstractmethod
    def grant(self, ttl: int, *, timeout: float | None = None) -> Lease:
        """A new lease of `ttl` seconds (etcd may grant more; `Lease.ttl` says)."""

    @abstractmethod
    def keepalive(self, lease: LeaseId, *, timeout: float | None = None) -> int:
        """Renew `lease`; its TTL from now (seconds), or 0 when it no longer exists."""

    @abstractmethod
    def revoke(self, lease: LeaseId, *, timeout: float | None = None) -> bool:
        """Revoke `lease` and delete its keys at once; False when it did not exist."""

    @abstractmethod
    def watch(
        self,
        key: bytes,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        timeout: float | None = None,
    ) -> Watch:
        """Watch `key` (or every key under it with `prefix`) from `start_revision`
        (0: from now). Raises `CoordinatorUnavailable` when the stream cannot be opened within
        `timeout`."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection (idempotent); open watches are the caller's to close."""
