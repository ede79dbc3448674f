"""Error codes and the one exception hierarchy of kvpool.

`ErrorCode` carries Mooncake Store's names and numbers (mooncake-store/include/types.h), so a
code seen on the wire, in a log or returned by the Mooncake-compatible API means the same thing
it means in Mooncake. Inside kvpool, expected outcomes travel as codes in reply messages; the
native Python API turns a failing code into an exception exactly once, at its boundary, with
`raise_for_code` / `error_for_code`.

Families (each a subclass of `KVPoolError`, so callers can catch as broadly as they like):

    KVPoolError
    ├── InvalidParams            INVALID_PARAMS, INVALID_KEY, INVALID_VERSION, BUFFER_OVERFLOW, ...
    ├── ObjectError              -700..-714
    │   ├── ObjectNotFound       OBJECT_NOT_FOUND
    │   ├── ObjectAlreadyExists  OBJECT_ALREADY_EXISTS
    │   ├── ObjectHasLease       OBJECT_HAS_LEASE
    │   ├── ReplicaNotReady      REPLICA_IS_NOT_READY
    │   └── LeaseExpired         LEASE_EXPIRED
    ├── NoSpace                  NO_AVAILABLE_HANDLE (the pool is full)
    ├── SegmentError             SEGMENT_NOT_FOUND, SEGMENT_ALREADY_EXISTS, CLIENT_NOT_FOUND
    ├── IllegalClient            ILLEGAL_CLIENT
    ├── TransferError            TRANSFER_FAIL
    ├── ChecksumMismatch         CHECKSUM_MISMATCH
    ├── RpcError                 RPC_FAIL, RPC_TIMEOUT (a fault of the connection)
    │   └── NotLeader            NOT_LEADER, LEADER_CHANGED (an HA master that does not lead)
    ├── StoreClosed              calls after close() (UNAVAILABLE_IN_CURRENT_STATUS)
    ├── Unauthenticated          UNAUTHENTICATED (no token, or a wrong one, where one is needed)
    ├── PermissionDenied         PERMISSION_DENIED (the token's tenant or role does not allow it)
    └── ...                      every other code maps to KVPoolError itself
"""

from __future__ import annotations

from enum import IntEnum
from typing import NoReturn

__all__ = [
    "ChecksumMismatch",
    "ErrorCode",
    "IllegalClient",
    "InvalidParams",
    "KVPoolError",
    "LeaseExpired",
    "NoSpace",
    "NotLeader",
    "ObjectAlreadyExists",
    "ObjectError",
    "ObjectHasLease",
    "ObjectNotFound",
    "PermissionDenied",
    "ReplicaNotReady",
    "RpcError",
    "SegmentError",
    "StoreClosed",
    "TransferError",
    "Unauthenticated",
    "error_for_code",
    "raise_for_code",
]


class ErrorCode(IntEnum):
    """Mooncake Store's error codes, same names, same numbers (0 is success)."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    REPLICA_NOT_IN_LOCAL_MEMORY = -713
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    OPLOG_ENTRY_NOT_FOUND = -1004
    K8S_LEASE_OPERATION_ERROR = -1005
    K8S_LEASE_NOT_FOUND = -1006
    INCOMPLETE_OPLOG_CATCH_UP = -1007
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    NOT_SUPPORTED = -1012
    FILE_NOT_FOUND = -1100
    FILE_OPEN_FAIL = -1101
    FILE_READ_FAIL = -1102
    FILE_WRITE_FAIL = -1103
    FILE_INVALID_BUFFER = -1104
    FILE_LOCK_FAIL = -1105
    FILE_INVALID_HANDLE = -1106
    BUCKET_NOT_FOUND = -1200
    BUCKET_ALREADY_EXISTS = -1201
    KEYS_EXCEED_BUCKET_LIMIT = -1202
    KEYS_ULTRA_LIMIT = -1203
    UNABLE_OFFLOAD = -1300
    UNABLE_OFFLOADING = -1301
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401
    JOB_NOT_FOUND = -1402
    SERIALIZE_UNSUPPORTED = -1500
    SERIALIZE_FAIL = -1501
    DESERIALIZE_FAIL = -1502
    PERSISTENT_FAIL = -1503
    DFS_NETWORK_TIMEOUT = -1600
    DFS_SERVICE_UNAVAILABLE = -1601
    DFS_QUOTA_EXCEEDED = -1602
    DFS_PERMISSION_DENIED = -1603
    DFS_STALE_HANDLE = -1604
    DFS_PARTIAL_WRITE = -1605
    TENANT_QUOTA_EXCEEDED = -1700
    TENANT_NOT_REGISTERED = -1701
    TENANT_NOT_EMPTY = -1702
    # kvpool's own codes (no Mooncake counterpart): the master of an HA cluster.
    NOT_LEADER = -1900
    LEADER_CHANGED = -1901
    # kvpool's own codes: credentials (docs/security.md).
    UNAUTHENTICATED = -1910
    PERMISSION_DENIED = -1911

    @classmethod
    def of(cls, value: int) -> ErrorCode:
        """The code for `value`; an unknown negative number becomes INTERNAL_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.INTERNAL_ERROR


class KVPoolError(Exception):
    """Root of every kvpool exception; `.code` is the `ErrorCode` it stands for."""

    default_code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        self.code: ErrorCode = code if code is not None else self.default_code
        self.message = message or self.code.name
        super().__init__(f"{self.code.name} ({int(self.code)}): {self.message}")


class InvalidParams(KVPoolError, ValueError):
    """The request itself is wrong: nothing was changed."""

    default_code = ErrorCode.INVALID_PARAMS


class ObjectError(KVPoolError):
    """Something about one object's state refused the operation."""

    default_code = ErrorCode.INVALID_WRITE


class ObjectNotFound(ObjectError, KeyError):
    default_code = ErrorCode.OBJECT_NOT_FOUND

    def __str__(self) -> str:  # KeyError would repr() the message
        return Exception.__str__(self)


class ObjectAlreadyExists(ObjectError):
    default_code = ErrorCode.OBJECT_ALREADY_EXISTS


class ObjectHasLease(ObjectError):
    default_code = ErrorCode.OBJECT_HAS_LEASE


class ReplicaNotReady(ObjectError):
    default_code = ErrorCode.REPLICA_IS_NOT_READY


class LeaseExpired(ObjectError):
    default_code = ErrorCode.LEASE_EXPIRED


class NoSpace(KVPoolError):
    """No segment had room for the object (NO_AVAILABLE_HANDLE)."""

    default_code = ErrorCode.NO_AVAILABLE_HANDLE


class SegmentError(KVPoolError):
    default_code = ErrorCode.SEGMENT_NOT_FOUND


class IllegalClient(KVPoolError):
    """The caller is not the client that owns what it tried to change."""

    default_code = ErrorCode.ILLEGAL_CLIENT


class TransferError(KVPoolError):
    """Moving bytes between a buffer and a segment failed (peer gone, timeout, bad range)."""

    default_code = ErrorCode.TRANSFER_FAIL


class ChecksumMismatch(KVPoolError):
    """The bytes read back do not hash to the checksum recorded when they were written."""

    default_code = ErrorCode.CHECKSUM_MISMATCH


class RpcError(KVPoolError, ConnectionError):
    """The control-plane connection failed or timed out (a fault, not an outcome)."""

    default_code = ErrorCode.RPC_FAIL


class NotLeader(RpcError):
    """The master asked is not the leader of its HA cluster (NOT_LEADER: a standby, or a
    deposed leader; nothing was applied), or it lost the lead while the request was being
    replicated (LEADER_CHANGED: it may or may not have been applied). Either way the caller
    finds the current leader and, where repeating the request is safe, asks it again."""

    default_code = ErrorCode.NOT_LEADER


class StoreClosed(KVPoolError, RuntimeError):
    """The object was used after close() (or before it was set up)."""

    default_code = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS


class Unauthenticated(KVPoolError):
    """The master needs a token and the connection proved none, or a wrong one
    (UNAUTHENTICATED); nothing was served on it."""

    default_code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(KVPoolError):
    """The connection's token does not allow the request: another tenant's objects, or a
    request its role may not make (PERMISSION_DENIED); nothing was changed."""

    default_code = ErrorCode.PERMISSION_DENIED


_FAMILY: dict[ErrorCode, type[KVPoolError]] = {
    ErrorCode.INVALID_PARAMS: InvalidParams,
    ErrorCode.INVALID_KEY: InvalidParams,
    ErrorCode.INVALID_VERSION: InvalidParams,
    ErrorCode.BUFFER_OVERFLOW: InvalidParams,
    ErrorCode.SHARD_INDEX_OUT_OF_RANGE: InvalidParams,
    ErrorCode.OBJECT_NOT_FOUND: ObjectNotFound,
    ErrorCode.OBJECT_ALREADY_EXISTS: ObjectAlreadyExists,
    ErrorCode.OBJECT_HAS_LEASE: ObjectHasLease,
    ErrorCode.REPLICA_IS_NOT_READY: ReplicaNotReady,
    ErrorCode.LEASE_EXPIRED: LeaseExpired,
    ErrorCode.NO_AVAILABLE_HANDLE: NoSpace,
    ErrorCode.SEGMENT_NOT_FOUND: SegmentError,
    ErrorCode.SEGMENT_ALREADY_EXISTS: SegmentError,
    ErrorCode.CLIENT_NOT_FOUND: SegmentError,
    ErrorCode.ILLEGAL_CLIENT: IllegalClient,
    ErrorCode.TRANSFER_FAIL: TransferError,
    ErrorCode.CHECKSUM_MISMATCH: ChecksumMismatch,
    ErrorCode.RPC_FAIL: RpcError,
    ErrorCode.RPC_TIMEOUT: RpcError,
    ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS: StoreClosed,
    ErrorCode.NOT_LEADER: NotLeader,
    ErrorCode.LEADER_CHANGED: NotLeader,
    ErrorCode.UNAUTHENTICATED: Unauthenticated,
    ErrorCode.PERMISSION_DENIED: PermissionDenied,
}
for _code in ErrorCode:
    if -714 <= _code <= -700 and _code not in _FAMILY:
        _FAMILY[_code] = ObjectError


def error_for_code(code: int, message: str = "") -> KVPoolError:
    """The exception that stands for `code` (never raises; unknown codes → INTERNAL_ERROR)."""
    ec = ErrorCode.of(code)
    cls = _FAMILY.get(ec, KVPoolError)
    return cls(message, ec)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the exception for `code` unless it is OK (0)."""
    if code != 0:
        _raise(error_for_code(code, message))


def _raise(exc: KVPoolError) -> NoReturn:
    raise exc
