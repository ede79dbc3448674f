"""kvpool: a distributed KV-cache pool for LLM serving.

The public API is what `__all__` names (a test pins it); everything else is private.
"""

from __future__ import annotations

from kvpool.errors import (
    ChecksumMismatch,
    ErrorCode,
    IllegalClient,
    InvalidParams,
    KVPoolError,
    LeaseExpired,
    NoSpace,
    ObjectAlreadyExists,
    ObjectHasLease,
    ObjectNotFound,
    ReplicaNotReady,
    RpcError,
    StoreClosed,
    TransferError,
)

__version__ = "0.1.0"

__all__ = [
    "ChecksumMismatch",
    "ErrorCode",
    "IllegalClient",
    "InvalidParams",
    "KVPoolError",
    "LeaseExpired",
    "NoSpace",
    "ObjectAlreadyExists",
    "ObjectHasLease",
    "ObjectNotFound",
    "ReplicaNotReady",
    "RpcError",
    "StoreClosed",
    "TransferError",
    "__version__",
]
