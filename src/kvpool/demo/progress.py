"""A minimal terminal progress bar for the commands (`kvpool node`, `kvpool demo`).

Commands, not the library, talk to the terminal. On a terminal the bar redraws one line in
place (at most ten times a second, so it never costs measurable time); when the output is a pipe or
a file (tests, `make run | tee`) it prints a single line when the work is done instead of hundreds
of carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]

_WIDTH = 30
_REDRAW_S = 0.1


class ProgressBar:
    """`with ProgressBar("prefill", total_bytes) as bar: bar.advance(n)`."""

    def __init__(
        self, label: str, total: int, unit: str = "B", stream: TextIO | None = None
    ) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.unit = unit
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._closed = False

    def advance(self, n: int) -> None:
        self.done = min(self.done + n, self.total)
        now = time.perf_counter()
        if self._tty and (now - self._last_draw >= _REDRAW_S or self.done >= self.total):
            self._last_draw = now
            self._stream.write("\r" + self._line(now))
            self._stream.flush()

    def _line(self, now: float) -> str:
        frac = self.done / self.total
        filled = int(frac * _WIDTH)
        elapsed = max(now - self._start, 1e-9)
        if self.unit == "B":
            rate = f"{self.done / elapsed / 1e9:6.2f} GB/s"
            amount = f"{self.done / 2**20:8.1f}/{self.total / 2**20:.1f} MiB"
        else:
            rate = f"{self.done / elapsed:8.0f} {self.unit}/s"
            amount = f"{self.done}/{self.total} {self.unit}"
        bar = "#" * filled + "." * (_WIDTH - filled)
        return f"{self.label:<10} [{bar}] {frac * 100:5.1f}% {amount} {rate} {elapsed:5.1f} s"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        line = self._line(time.perf_counter())
        self._stream.write(("\r" + line + "\n") if self._tty else (line + "\n"))
        self._stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
