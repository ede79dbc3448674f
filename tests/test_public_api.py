"""The public surface of `kvpool` is exactly what `__all__` names, and every name resolves."""

from __future__ import annotations

import subprocess
import sys

import kvpool

EXPECTED = {
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
}


def test_all_is_pinned() -> None:
    assert set(kvpool.__all__) == EXPECTED
    assert len(kvpool.__all__) == len(EXPECTED)


def test_every_public_name_resolves() -> None:
    for name in kvpool.__all__:
        assert getattr(kvpool, name) is not None, name
    from kvpool.client import Store, StoreConfig

    assert kvpool.Store is Store
    assert kvpool.StoreConfig is StoreConfig


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        kvpool.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_import_kvpool_does_not_load_the_data_plane() -> None:
    code = "import sys, kvpool; print('kvpool.transfer' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
