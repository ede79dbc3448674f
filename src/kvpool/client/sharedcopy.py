"""Checksummed copies of large values in Python: the chunk a copy is hashed by (`chunk_for`),
and copies shared with a helper thread (`Share`, `CopyHelper`).

`kvpool.client.datapath` uses them when the fused copy (`kvpool.transfer.native`) is not
built (`chunk_for`), and for values of SHARED_MIN and more, which a helper thread may copy
part of while the caller hashes, whichever way measured faster lately (`CopyHelper.wanted`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import statistics
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kvpool.transfer.copy import BOUNCE_MAX, slow_distance

__all__ = [
    "CHUNKED_MIN",
    "HASH_CHUNK",
    "LONG_CHUNK",
    "SHARED_MIN",
    "SHARE_PIECE",
    "CopyHelper",
    "Share",
    "chunk_for",
]

log = logging.getLogger(__name__)

HASH_CHUNK: Final = 256 << 10
"""Large values on mapped segments are copied and hashed in chunks of this size, in one
thread: each chunk is hashed while it is still in the CPU cache, which is faster than copying
the whole value and hashing it after. Overlapping the hash with a copy in the engine's copy
thread instead was slower: waking another thread costs more than the whole hash
(docs/parts/perf-store.md)."""
CHUNKED_MIN: Final = 4 * HASH_CHUNK
"""Single values at least this large take the chunked copy-and-hash path."""
LONG_CHUNK: Final = 1 << 20
"""The chunk used instead of HASH_CHUNK when the destination lies just past the source modulo
a page (see `chunk_for`): copies this large take glibc's vector loop, not `rep movsb`."""
SHARE_PIECE: Final = max(1 << 20, BOUNCE_MAX)
"""The piece each thread claims at a time in a shared copy (see `Share`): at least the L2
size, so glibc copies every piece with its vector loop whatever the distance (`chunk_for`);
larger pieces measured no faster."""
SHARED_MIN: Final = 4 * SHARE_PIECE
"""Single values at least this large are copied by the caller and a helper thread together;
smaller ones by the caller alone, in HASH_CHUNK pieces."""
_EXPLORE: Final = 8
"""Every this many large copies, the way that measured slower recently is timed again."""
_SAMPLES: Final = 5
"""Recent timings kept per way; their median is what the ways are compared by."""
_STALLS: Final = 2
"""The helper stops once the caller has made no progress during this many of its pieces."""
_memmove: Final = ctypes.memmove  # releases the GIL, so that the other thread can claim


def chunk_for(dst_addr: int, src_addr: int) -> int:
    """The copy-and-hash chunk for a copy from `src_addr` to `dst_addr`.

    glibc copies sizes from ~2 KiB up to the L2 size with `rep movsb`, which on AMD runs
    several times slower when the destination starts less than 64 bytes past the source
    modulo 4 KiB (glibc avoids that case only on Intel; docs/parts/perf-store.md). Exactly
    that happens on every get into a numpy array or a large bytearray (malloc'd at page + 16)
    from a page-aligned replica. Chunks of at least LONG_CHUNK take the vector loop at full
    speed and are still hashed from L2/L3.
    """
    if slow_distance(dst_addr, src_addr):
        return LONG_CHUNK
    return HASH_CHUNK


@dataclass(slots=True, eq=False)
class Share:
    """One large copy of `n` bytes from address `src` to `dst`, shared by two threads.

    Both threads claim SHARE_PIECE pieces in order from the front; the helper thread only
    copies its pieces, the caller copies its own and hashes every piece in order (xxh3 runs
    in order and in one thread), each as soon as it has been copied: one core does not reach
    the machine's copy bandwidth, and the hash of one piece runs while the other thread copies
    the next: with a free core this beats copying and hashing alone, and even a plain memcpy
    (docs/parts/perf-store.md, "a copy helper thread").
    Nothing is handed over and the caller waits only when the next piece to hash is the one
    the helper is still copying; a helper that starts late (its core busy) finds less left to
    claim, or nothing.

    A helper with no core of its own takes turns with the caller instead (with a CPU-bound
    process on the other core it copied nearly every piece while the caller waited to run,
    slower than the caller alone). So the helper stops once the caller has made no progress
    during _STALLS of its pieces, and the caller does most of that copy itself.

    A claim takes SHARE_PIECE bytes, or everything left when less than two pieces are, so no
    piece is shorter than SHARE_PIECE (or the whole copy) and none falls into glibc's slow
    `rep movsb` range. Fields are guarded by `lock`."""

    dst: int
    src: int
    n: int
    claimed: int = 0
    """[0, claimed) has been claimed."""
    copied: dict[int, int] = field(default_factory=dict)
    """Pieces (start: end) copied but not hashed yet."""
    lost: dict[int, int] = field(default_factory=dict)
    """Pieces the helper failed to copy (the caller copies them itself)."""
    helping: bool = False
    """The helper is copying a piece it claimed."""
    progress: int = 0
    """Pieces the caller has copied or hashed (it alone writes this; the helper reads it)."""
    waiter: threading.Lock | None = None
    """Held while the caller waits for the helper's piece; the helper releases it."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _claim(self) -> tuple[int, int] | None:
        c, n = self.claimed, self.n
        if c >= n:
            return None
        e = n if n - c < 2 * SHARE_PIECE else c + SHARE_PIECE
        self.claimed = e
        return c, e

    def help(self) -> None:
        """The helper's part: copy pieces until none is left to claim."""
        lock = self.lock
        seen = stalled = -1
        while True:
            with lock:
                if self.progress == seen:
                    stalled += 1
                    if stalled >= _STALLS:  # the caller is not running: leave the CPU to it
                        return
                else:
                    seen, stalled = self.progress, 0
                piece = self._claim()
                if piece is None:
                    return
                self.helping = True
            c, e = piece
            ok = False
            try:
                _memmove(self.dst + c, self.src + c, e - c)
                ok = True
            finally:
                self.helped(c, e, ok)

    def helped(self, start: int, end: int, ok: bool) -> None:
        """The helper is done with its piece (`ok`: copied); wakes the caller if it waits."""
        with self.lock:
            (self.copied if ok else self.lost)[start] = end
            self.helping = False
            if self.waiter is not None:
                self.waiter.release()
                self.waiter = None

    def copy_hashing(self, view: memoryview, update: Callable[[memoryview], None]) -> None:
        """The caller's part: copy pieces, and hash `view` (the caller's buffer: the source of
        a write, the destination of a read) in order as its pieces are copied."""
        lock, dst, src, n = self.lock, self.dst, self.src, self.n
        step = chunk_for(dst, src)
        hashed = 0
        while hashed < n:
            waiter = None
            with lock:
                end = self.copied.pop(hashed, 0)
                piece = None
                if not end:
                    redo = self.lost.pop(hashed, 0)
                    piece = (hashed, redo) if redo else self._claim()
                    if piece is None:  # the helper is copying the piece at `hashed`
                        waiter = self.waiter = threading.Lock()
                        waiter.acquire()
            if waiter is not None:
                waiter.acquire()
                continue
            if piece is not None:
                c, end = piece
                if c != hashed:  # the helper is still copying an earlier piece
                    _memmove(dst + c, src + c, end - c)
                    self.progress += 1
                    with lock:
                        self.copied[c] = end
                    continue
                # The next to hash: copy and hash it in chunks, each hashed from L2 (as when
                # the caller copies alone; whole 1 MiB pieces were hashed from L3, slower).
                while c < end:
                    e = end if end - c < 2 * step else c + step
                    _memmove(dst + c, src + c, e - c)
                    update(view[c:e])
                    self.progress += 1
                    c = e
                hashed = end
                continue
            update(view[hashed:end])
            self.progress += 1
            hashed = end

    def settle(self) -> None:
        """Let the helper claim nothing more and wait for the piece it is copying, if any:
        once the caller returns (an exception included) nothing may write into the segment
        or the caller's buffer."""
        with self.lock:
            self.claimed = self.n
            if not self.helping:
                return
            waiter = self.waiter = threading.Lock()
            waiter.acquire()
        interrupted: BaseException | None = None
        while True:  # an interrupt must not let the caller leave while the helper writes
            try:
                waiter.acquire()
                break
            except BaseException as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


class CopyHelper:
    """The helper thread of shared copies (see `Share`), started on first use, and whether
    to use it. Thread-safe."""

    def __init__(self) -> None:
        self._shares: queue.SimpleQueue[Share | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()  # of the process the thread runs in
        # One CPU: a second thread could only take turns with the caller.
        self._closed = len(os.sched_getaffinity(0)) < 2
        # Recent seconds per byte of large copies by (read, shared): reads and writes differ.
        self._timings: dict[tuple[bool, bool], deque[float]] = {
            (read, shared): deque(maxlen=_SAMPLES)
            for read in (False, True)
            for shared in (False, True)
        }
        self._copies = 0

    def wanted(self, read: bool) -> bool:
        """Whether the next large copy should be shared: the way that was faster lately.

        Whether a helper pays depends on what else the machine runs, and it changes: on an
        idle machine shared copies are clearly faster, but while other processes keep every
        core busy they are slower than the caller alone. So both ways are timed as they run, the median of their recent timings decides, and every _EXPLORE-th
        copy takes the other way to keep its timing current. Unsynchronised between callers:
        a hint, harmless when stale."""
        if self._closed:
            return False
        self._copies += 1
        shared, alone = self._timings[read, True], self._timings[read, False]
        if len(shared) < 2 or len(alone) < 2:  # learn both first
            return len(shared) <= len(alone)
        faster = statistics.median(shared) <= statistics.median(alone)
        return faster != (self._copies % _EXPLORE == 0)

    def timed(self, read: bool, shared: bool, seconds: float, nbytes: int) -> None:
        """A large copy (`read`: from a segment) of `nbytes` took `seconds`, `shared` or by
        the caller alone."""
        self._timings[read, shared].append(seconds / nbytes)

    def offer(self, share: Share) -> bool:
        """Let the helper take pieces of `share`; False when there is no helper (closed)."""
        with self._lock:
            if self._closed:
                return False
            if self._thread is not None and self._pid != os.getpid():
                # A forked child: the parent's thread is not here, nor its queue's consumer.
                self._thread, self._shares = None, queue.SimpleQueue()
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="kvpool-copy-helper", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: the caller copies alone
                    log.warning("no copy helper thread (%s): large copies run alone", exc)
                    self._closed = True
                    return False
                self._thread, self._pid = thread, os.getpid()
            self._shares.put(share)
        return True

    def close(self) -> None:
        """Stop the thread once the shares offered are done (idempotent)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            if thread is not None:
                self._shares.put(None)
        if thread is not None and self._pid == os.getpid():  # a fork's child has no thread
            thread.join()

    def _run(self) -> None:
        shares = self._shares
        while True:
            share = shares.get()
            if share is None:
                return
            try:
                share.help()
            except Exception:  # the piece is in share.lost: the caller copies it
                log.exception("copy helper: a copy failed; the caller makes it itself")
            share = None  # do not keep the caller's buffers while waiting
