"""TransferFuture: per-request codes, pieces, abort, grace period and forced cleanup."""

from __future__ import annotations

import threading
import time

import pytest

from kvpool.errors import ErrorCode, TransferError
from kvpool.transfer import TransferFuture


def test_a_request_in_pieces_ends_with_its_last_piece_and_first_error() -> None:
    fut = TransferFuture(2)
    fut.set_pieces(0, 3)
    fut.complete(0, ErrorCode.OK)
    fut.complete(0, ErrorCode.TRANSFER_FAIL, "lane 2 broke")
    assert fut.status(0) is None  # a third piece may still be writing into the buffer
    fut.complete(0, ErrorCode.OK)
    assert fut.status(0) is ErrorCode.TRANSFER_FAIL and fut.message(0) == "lane 2 broke"
    assert not fut.done()
    fut.complete(1, ErrorCode.OK)
    assert fut.done()
    assert fut.result() == [ErrorCode.TRANSFER_FAIL, ErrorCode.OK]
    assert fut.wait() is ErrorCode.TRANSFER_FAIL


def test_wait_from_another_thread_wakes_on_the_last_completion() -> None:
    fut = TransferFuture(1)
    got: list[ErrorCode] = []
    t = threading.Thread(target=lambda: got.append(fut.wait(10)))
    t.start()
    fut.complete(0, ErrorCode.SEGMENT_NOT_FOUND, "gone")
    t.join(10)
    assert got == [ErrorCode.SEGMENT_NOT_FOUND]


def test_timeout_aborts_then_forces_cleanup_after_the_grace_period() -> None:
    fut = TransferFuture(2, grace=0.2)
    aborted = threading.Event()
    assert fut.add_abort_hook(1, aborted.set)
    fut.complete(1, ErrorCode.OK)
    t0 = time.monotonic()
    assert fut.wait(0.1) is ErrorCode.TRANSFER_FAIL
    assert 0.25 <= time.monotonic() - t0 < 5
    assert aborted.is_set() and fut.aborted
    assert fut.result() == [ErrorCode.TRANSFER_FAIL, ErrorCode.OK]
    fut.complete(0, ErrorCode.OK)  # a straggler after the forced cleanup is ignored
    assert fut.status(0) is ErrorCode.TRANSFER_FAIL
    assert not fut.add_abort_hook(2, aborted.set)  # no new work on an aborted batch


def test_a_worker_that_finishes_within_the_grace_period_wins() -> None:
    fut = TransferFuture(1, grace=5.0)

    def on_abort() -> None:  # the worker notices the abort and reports promptly
        threading.Timer(0.05, fut.complete, (0, ErrorCode.TRANSFER_FAIL, "aborted")).start()

    fut.add_abort_hook(7, on_abort)
    t0 = time.monotonic()
    assert fut.wait(0.05) is ErrorCode.TRANSFER_FAIL
    assert time.monotonic() - t0 < 3  # did not sit out the whole grace period
    assert fut.message(0) == "aborted"


def test_raise_for_status_names_the_first_failed_request() -> None:
    fut = TransferFuture(3, describe=lambda i: f"READ seg@{i}")
    fut.complete(0, ErrorCode.OK)
    fut.complete(2, ErrorCode.INVALID_PARAMS, "out of bounds")
    fut.complete(1, ErrorCode.TRANSFER_FAIL, "peer died")
    with pytest.raises(TransferError) as info:
        fut.raise_for_status()
    assert info.value.code is ErrorCode.TRANSFER_FAIL
    assert "request 1 (READ seg@1) failed: peer died" in str(info.value)
    assert fut.wait() is ErrorCode.INVALID_PARAMS  # the first error recorded


def test_an_empty_batch_is_done_at_once() -> None:
    fut = TransferFuture(0)
    assert fut.done() and fut.wait(0) is ErrorCode.OK and fut.result() == []
    fut.raise_for_status()
