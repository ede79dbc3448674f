"""`RateLimitedLog`: log lines of repeated events at most once per kind per interval.

A server that logs one line per malformed, refused or timed-out connection lets any client fill
its log (and spend its CPU writing it): one attack of 1,715 malformed connections once meant
1,715 WARNING lines. Servers log such events through a `RateLimitedLog` instead: the first event
of a kind is logged at once, later ones within `interval` seconds are only counted, and the next
line of that kind says how many were left out::

    limited = RateLimitedLog(log, interval=10.0)
    limited.warning("malformed", "closing connection from %s: %s", peer, why)
    # -> "closing connection from 1.2.3.4:5: bad magic (41 more like this in the last 10 s)"

Kinds are a small fixed set of strings chosen by the caller (never peer-supplied text), and at
most `max_kinds` are tracked, so the bookkeeping stays bounded. Thread-safe: the transfer
server logs from its worker threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["RateLimitedLog"]

_MAX_KINDS: Final = 64


class RateLimitedLog:
    """Logs through `logger`, one line per kind per `interval` seconds, with suppressed counts."""

    __slots__ = ("_clock", "_kinds", "_lock", "interval", "logger")

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval >= 0:
            raise ValueError(f"interval: {interval!r} must be >= 0 s")
        self.logger = logger
        self.interval = interval
        self._clock = clock
        # kind -> [time of the last line, events left out since]
        self._kinds: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def log(self, level: int, kind: str, msg: str, *args: object) -> bool:
        """Log `msg % args` unless a line of `kind` was logged within `interval`; True if it was."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self._clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is not None and now - entry[0] < self.interval:
                entry[1] += 1
                return False
            suppressed = int(entry[1]) if entry is not None else 0
            if entry is None:
                if len(self._kinds) >= _MAX_KINDS:
                    self._kinds.clear()  # a caller misused kinds; forget rather than grow
                self._kinds[kind] = [now, 0]
            else:
                entry[0], entry[1] = now, 0
        if suppressed:
            msg += " (%d more like this in the last %.0f s)"
            args = (*args, suppressed, self.interval)
        self.logger.log(level, msg, *args)
        return True

    def warning(self, kind: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, kind, msg, *args)

    def info(self, kind: str, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, kind, msg, *args)

    def suppressed(self, kind: str) -> int:
        """Events of `kind` counted but not logged since its last line."""
        with self._lock:
            entry = self._kinds.get(kind)
            return int(entry[1]) if entry is not None else 0
