"""kvpool: a distributed KV-cache pool for LLM serving.

The public API is what `__all__` names (a test pins it); everything else is private.

`Store`, `StoreConfig`, `AsyncStore`, `ReplicateConfig`, `SoftPinAction`, `HealthStatus`,
`PutResult` and `PutStats` come from `kvpool.client` and are imported on first use, so that `import kvpool` (and every
`kvpool` command's start-up) does not pay for numpy, the RPC client and the transfer engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    PermissionDenied,
    ReplicaNotReady,
    RpcError,
    StoreClosed,
    TransferError,
    Unauthenticated,
)

if TYPE_CHECKING:
    from kvpool.client import (
        AsyncStore,
        HealthStatus,
        PutResult,
        PutStats,
        ReplicateConfig,
        SoftPinAction,
        Store,
        StoreConfig,
    )

__version__ = "0.1.0"

_LAZY = {
    "AsyncStore",
    "HealthStatus",
    "PutResult",
    "PutStats",
    "ReplicateConfig",
    "SoftPinAction",
    "Store",
    "StoreConfig",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import kvpool.client

        return getattr(kvpool.client, name)
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")


__all__ = [
    "AsyncStore",
    "ChecksumMismatch",
    "ErrorCode",
    "HealthStatus",
    "IllegalClient",
    "InvalidParams",
    "KVPoolError",
    "LeaseExpired",
    "NoSpace",
    "ObjectAlreadyExists",
    "ObjectHasLease",
    "ObjectNotFound",
    "PermissionDenied",
    "PutResult",
    "PutStats",
    "ReplicaNotReady",
    "ReplicateConfig",
    "RpcError",
    "SoftPinAction",
    "Store",
    "StoreClosed",
    "StoreConfig",
    "TransferError",
    "Unauthenticated",
    "__version__",
]
