"""The public surface of kvpool.transfer is what docs/architecture.md promises, no more."""

from __future__ import annotations

import kvpool.transfer as transfer


def test_all_is_pinned() -> None:
    assert sorted(transfer.__all__) == [
        "AddressOverlapped",
        "MemoryRegion",
        "Resolver",
        "RouteKind",
        "SegmentHold",
        "SegmentLocation",
        "SegmentMemory",
        "SharedMapping",
        "TransferEngine",
        "TransferFuture",
        "TransferOp",
        "TransferRequest",
        "TransferServer",
        "Transport",
        "host_id",
        "quarantined_count",
    ]
    for name in transfer.__all__:
        assert getattr(transfer, name) is not None


def test_host_id_is_stable_and_short() -> None:
    assert transfer.host_id() == transfer.host_id()
    assert len(transfer.host_id()) == 16
    int(transfer.host_id(), 16)


def test_there_is_no_tiers_package_until_there_are_tiers() -> None:
    """An empty `kvpool.tiers` promised disk tiers the data plane does not have."""
    import importlib.util

    assert importlib.util.find_spec("kvpool.tiers") is None
