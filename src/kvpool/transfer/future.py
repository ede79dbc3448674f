"""`TransferFuture`: the state of one submitted batch, and how it is cancelled.

Each request of the batch ends with one `ErrorCode` (OK or why it failed); a request that the
engine split into pieces (striping) ends when its last piece does, with the first error of its
pieces. `wait(timeout)` cancels in three steps, as Mooncake's transfer engine does: on timeout it asks
for an abort (workers stop between pieces; sockets in use are shut down so blocked calls
return), waits a grace period for the workers to notice, then forces the cleanup: every
request still pending is finished with TRANSFER_FAIL. Late completions after that are ignored.

Thread safety: completions come from any worker thread; all state is under one lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from kvpool.errors import ErrorCode, TransferError

__all__ = ["TransferFuture"]

AbortHook = Callable[[], None]


class TransferFuture:
    """Result of `TransferEngine.submit`: `done()`, `wait()`, `result()`, per-request status."""

    __slots__ = (
        "_abort_hooks",
        "_aborted",
        "_codes",
        "_describe",
        "_errors",
        "_event",
        "_first_error",
        "_grace",
        "_lock",
        "_messages",
        "_pending",
        "_pieces",
    )

    def __init__(
        self,
        count: int,
        grace: float = 1.0,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        self._codes: list[ErrorCode | None] = [None] * count  # final, per request
        self._errors: list[ErrorCode | None] = [None] * count  # first failed piece's code
        self._messages: list[str] = [""] * count
        self._pieces = [1] * count
        self._pending = count
        self._lock = threading.Lock()
        # Created only when someone waits on an unfinished batch: an Event costs more than a
        # whole inline 4 KiB copy, and most small batches are done before anyone waits.
        self._event: threading.Event | None = None
        self._first_error = ErrorCode.OK
        self._aborted = False
        self._abort_hooks: dict[int, AbortHook] = {}
        self._grace = grace
        self._describe = describe

    # ---- caller side ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._codes)

    def done(self) -> bool:
        """True when every request has finished (successfully or not)."""
        return self._pending == 0

    def wait(self, timeout: float | None = None) -> ErrorCode:
        """Wait for the batch; returns OK or the first error recorded.

        On timeout: abort, wait the grace period, then fail whatever is still pending.
        """
        if self._pending == 0:
            return self._first_error
        with self._lock:
            if self._pending == 0:
                return self._first_error
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            self.cancel()
            if not event.wait(self._grace):
                self._force_finish("timed out; aborted after the grace period")
        return self._first_error

    def result(self, timeout: float | None = None) -> list[ErrorCode]:
        """Wait (as `wait`) and return every request's final code."""
        self.wait(timeout)
        return [c if c is not None else ErrorCode.TRANSFER_FAIL for c in self._codes]

    def status(self, index: int) -> ErrorCode | None:
        """Request `index`'s code, or None while it is still running."""
        return self._codes[index]

    def message(self, index: int) -> str:
        """Why request `index` failed ("" when it did not)."""
        return self._messages[index]

    @property
    def aborted(self) -> bool:
        return self._aborted

    def cancel(self) -> None:
        """Ask every worker of this batch to stop; requests not yet done end TRANSFER_FAIL."""
        with self._lock:
            if self._aborted or self._pending == 0:
                return
            self._aborted = True
            hooks = list(self._abort_hooks.values())
        for hook in hooks:
            with contextlib.suppress(OSError):
                hook()

    def raise_for_status(self) -> None:
        """Raise `TransferError` (with the failing code) naming the first failed request."""
        for i, status in enumerate(self._codes):
            if status is not ErrorCode.OK:
                code = status if status is not None else ErrorCode.TRANSFER_FAIL
                what = self._describe(i) if self._describe is not None else ""
                msg = self._messages[i] or code.name
                raise TransferError(
                    f"request {i}{' (' + what + ')' if what else ''} failed: {msg}", code
                )

    # ---- worker side ---------------------------------------------------------------------

    def set_pieces(self, index: int, pieces: int) -> None:
        """Request `index` will complete through `pieces` calls to `complete` (before any)."""
        self._pieces[index] = pieces

    def complete(self, index: int, code: ErrorCode, message: str = "") -> None:
        """One piece of request `index` ended with `code`.

        A request ends when its last piece does (with its first error), not at its first
        failed piece: until then other workers may still be writing into its buffer, and the
        caller must not get the buffer back while they do.
        """
        with self._lock:
            if self._codes[index] is not None:
                return  # already finished (or forced after the grace period)
            if code is not ErrorCode.OK and self._errors[index] is None:
                self._errors[index] = code
                self._messages[index] = message or code.name
            self._pieces[index] -= 1
            if self._pieces[index] > 0:
                return
            self._finish(index, self._errors[index] or ErrorCode.OK)
            event = self._event if self._pending == 0 else None
        if event is not None:
            event.set()

    def _finish(self, index: int, code: ErrorCode) -> None:
        """Record request `index`'s final code (call with the lock held)."""
        self._codes[index] = code
        if code is not ErrorCode.OK and self._first_error is ErrorCode.OK:
            self._first_error = code
        self._pending -= 1

    def add_abort_hook(self, key: int, hook: AbortHook) -> bool:
        """Call `hook` on cancel; False (hook not added) when already aborted."""
        with self._lock:
            if self._aborted:
                return False
            self._abort_hooks[key] = hook
            return True

    def remove_abort_hook(self, key: int) -> None:
        with self._lock:
            self._abort_hooks.pop(key, None)

    def _force_finish(self, message: str) -> None:
        """TENT's forced cleanup: finish every request still pending as TRANSFER_FAIL."""
        with self._lock:
            for i, code in enumerate(self._codes):
                if code is None:
                    self._messages[i] = self._messages[i] or message
                    self._finish(i, ErrorCode.TRANSFER_FAIL)
            event = self._event
        if event is not None:
            event.set()
