"""The Store's same-host copy paths: chunk choice and byte-exact copies at awkward alignments.

glibc copies 2 KiB..L2-sized blocks with `rep movsb`, which runs 5-15x slower on AMD when the
destination lies 1-63 bytes past the source modulo a page (and, on CPUs where a
once-per-process probe measures it slow, exactly at it); `chunk_for` steers the
chunked copy-and-hash path to chunks that avoid that range. From SHARED_MIN on, a helper thread
copies some pieces while the caller hashes (`Share`): who copies what depends on timing, so the
tests run each side alone, both in every order the claims allow, and both racing for real, and
check that the bytes and the xxh3_64 of the whole value come out the same every time. Speed is
not asserted here (shared machine).
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import xxhash

from kvpool.client import ReplicateConfig, Store, sharedcopy
from kvpool.client.sharedcopy import (
    HASH_CHUNK,
    LONG_CHUNK,
    SHARE_PIECE,
    SHARED_MIN,
    CopyHelper,
    Share,
    chunk_for,
)
from kvpool.errors import ErrorCode, KVPoolError
from kvpool.protocol.messages import GetReplicaList, GetSegment, ReplicaListReply, Response
from kvpool.rpc.client import RpcClient
from kvpool.transfer.location import SegmentLocation
from kvtest.pool import Pool, PoolFactory, pool_module  # noqa: F401
from kvtest.procs import wait_until
from kvtest.stores import emptied_after


def test_short_destination_distance_gets_the_long_chunk() -> None:
    page = 1 << 30
    assert chunk_for(page + 16, page) == LONG_CHUNK
    assert chunk_for(page + 4096 + 63, page) == LONG_CHUNK
    assert chunk_for(page + 64, page) == HASH_CHUNK
    assert chunk_for(page + 2048, page) == HASH_CHUNK
    assert chunk_for(page - 16, page) == HASH_CHUNK  # the destination before the source
    assert LONG_CHUNK >= 512 << 10  # at least the L2-sized rep-movsb cut-over of glibc on AMD


def _random(nbytes: int, past_page: int, seed: int) -> np.ndarray:
    out = _aligned(nbytes, past_page)
    out[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return out


# Around the shared path's threshold and its piece boundaries (the last piece takes what is
# left when less than two pieces are), and odd sizes.
_SHARED_SIZES = [
    SHARED_MIN - 1,
    SHARED_MIN,
    SHARED_MIN + 1,
    5 * SHARE_PIECE - 1,
    5 * SHARE_PIECE + 4097,
    (9 << 20) + 5,
]


def _pieces(n: int) -> list[tuple[int, int]]:
    share = Share(0, 0, n)
    out = []
    while (piece := share._claim()) is not None:
        out.append(piece)
    return out


@pytest.mark.parametrize("n", [1, SHARE_PIECE, 2 * SHARE_PIECE - 1, *_SHARED_SIZES])
def test_claims_cover_the_copy_in_order_and_no_piece_is_short(n: int) -> None:
    pieces = _pieces(n)
    assert pieces[0][0] == 0 and pieces[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    # A short piece could fall into glibc's slow rep movsb range (see chunk_for).
    assert all(min(n, SHARE_PIECE) <= e - c < 2 * SHARE_PIECE for c, e in pieces)


def _run_share(n: int, past: tuple[int, int], helper_first: int, *, read: bool) -> None:
    """Copy n bytes through a `Share` whose helper copies `helper_first` pieces before the
    caller starts (-1: its own loop, which gives up while the caller makes no progress), then
    check the bytes and the hash of the caller's buffer."""
    user = _random(n, past[0], n) if not read else _aligned(n, past[0])
    other = _random(n, past[1], n + 1) if read else _aligned(n, past[1])
    if read:
        share = Share(user.ctypes.data, other.ctypes.data, n)
    else:
        share = Share(other.ctypes.data, user.ctypes.data, n)
    # The helper's part, in this thread, for a fixed order of claims.
    if helper_first < 0:
        share.help()  # the caller has not started: the helper must not take everything
        assert share.claimed == sharedcopy._STALLS * SHARE_PIECE
    for _ in range(max(helper_first, 0)):
        with share.lock:
            piece = share._claim()
        if piece is not None:
            c, e = piece
            np.copyto(_at(share.dst + c, e - c), _at(share.src + c, e - c))
            share.copied[c] = e
    hasher = xxhash.xxh3_64()
    view = memoryview(user).cast("B")
    share.copy_hashing(view, hasher.update)
    share.settle()
    assert np.array_equal(user, other)
    assert hasher.intdigest() == xxhash.xxh3_64_intdigest(other)
    assert not share.copied and not share.lost and not share.helping


def _at(addr: int, nbytes: int) -> np.ndarray:
    """The bytes at `addr` (inside an array this test owns) as an array."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


@pytest.mark.parametrize("read", [False, True], ids=["write", "read"])
@pytest.mark.parametrize("helper_first", [0, 1, 2, -1], ids=["alone", "one", "two", "stalled"])
@pytest.mark.parametrize("n", [SHARED_MIN, 5 * SHARE_PIECE + 4097])
def test_shared_copy_hashes_the_whole_value_whoever_copies_which_piece(
    n: int, helper_first: int, read: bool
) -> None:
    _run_share(n, (16, 2048), helper_first, read=read)


@pytest.mark.parametrize("read", [False, True], ids=["write", "read"])
@pytest.mark.parametrize("n", _SHARED_SIZES)
def test_shared_copy_racing_a_real_helper_is_byte_exact(n: int, read: bool) -> None:
    helper = CopyHelper()
    try:
        for past in ((0, 0), (16, 0), (48, 4000), (2048, 16)):
            user = _random(n, past[0], n) if not read else _aligned(n, past[0])
            other = _random(n, past[1], n + 1) if read else _aligned(n, past[1])
            if read:
                share = Share(user.ctypes.data, other.ctypes.data, n)
            else:
                share = Share(other.ctypes.data, user.ctypes.data, n)
            hasher = xxhash.xxh3_64()
            helper.offer(share)
            try:
                share.copy_hashing(memoryview(user).cast("B"), hasher.update)
            finally:
                share.settle()
            assert np.array_equal(user, other)
            assert hasher.intdigest() == xxhash.xxh3_64_intdigest(other)
    finally:
        thread = helper._thread
        helper.close()
    assert thread is None or not thread.is_alive()


def test_no_helper_thread_to_be_had_means_the_caller_copies_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thread.start failing (no threads left) for the helper: the copy is the caller's, byte
    exact, nothing waits in a queue nobody reads, and close() returns (review finding)."""
    helper = CopyHelper()
    helper._closed = False  # as on a machine with two CPUs
    start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        if self.name == "kvpool-copy-helper":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    n = SHARED_MIN
    user, other = _random(n, 16, 3), _aligned(n, 0)
    share = Share(other.ctypes.data, user.ctypes.data, n)
    assert helper.offer(share) is False
    hasher = xxhash.xxh3_64()
    try:
        share.copy_hashing(memoryview(user).cast("B"), hasher.update)
    finally:
        share.settle()
    assert np.array_equal(user, other)
    assert hasher.intdigest() == xxhash.xxh3_64_intdigest(user)
    assert helper.offer(Share(0, 0, 0)) is False and helper._shares.qsize() == 0
    helper.close()


@pytest.mark.parametrize("read", [False, True], ids=["write", "read"])
def test_pieces_copied_past_the_helpers_unfinished_one_are_hashed_after_it(read: bool) -> None:
    n = 5 * SHARE_PIECE + 4097
    user = _random(n, 16, 5) if not read else _aligned(n, 16)
    other = _random(n, 0, 6) if read else _aligned(n, 0)
    if read:
        share = Share(user.ctypes.data, other.ctypes.data, n)
    else:
        share = Share(other.ctypes.data, user.ctypes.data, n)
    with share.lock:  # the helper claims the first piece and is slow to copy it
        first = share._claim()
        share.helping = True
    assert first is not None

    def late_helper() -> None:
        # Once the caller has copied every other piece and waits for this one.
        wait_until(lambda: share.waiter is not None, what="the caller to wait")
        c, e = first
        np.copyto(_at(share.dst + c, e - c), _at(share.src + c, e - c))
        share.helped(c, e, ok=True)

    t = threading.Thread(target=late_helper)
    t.start()
    hasher = xxhash.xxh3_64()
    try:
        share.copy_hashing(memoryview(user).cast("B"), hasher.update)
    finally:
        share.settle()
        t.join()
    assert np.array_equal(user, other)
    assert hasher.intdigest() == xxhash.xxh3_64_intdigest(other)
    assert not share.copied and not share.helping


def test_a_caller_that_fails_midway_returns_only_once_the_helper_has_stopped_writing() -> None:
    n = 9 * SHARE_PIECE
    src, dst = _random(n, 0, 7), _aligned(n, 16)
    helper = CopyHelper()
    calls = 0

    def update(_: memoryview) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt  # anything the caller did not expect

    try:
        share = Share(dst.ctypes.data, src.ctypes.data, n)
        helper.offer(share)
        with pytest.raises(KeyboardInterrupt):
            try:
                share.copy_hashing(memoryview(src).cast("B"), update)
            finally:
                share.settle()
        with share.lock:
            assert not share.helping and share.claimed == n  # nothing more will be written
    finally:
        helper.close()


def test_a_piece_the_helper_failed_to_copy_is_copied_by_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 5 * SHARE_PIECE + 4097
    src, dst = _random(n, 16, 3), _aligned(n, 0)
    share = Share(dst.ctypes.data, src.ctypes.data, n)
    real = sharedcopy._memmove

    def fail_in_helper(d: int, s: int, count: int) -> int:
        if threading.current_thread().name == "helper":
            raise OSError("injected copy failure")
        return int(real(d, s, count))

    monkeypatch.setattr(sharedcopy, "_memmove", fail_in_helper)
    errors: list[BaseException] = []

    def helper() -> None:  # claims the first piece, fails to copy it, and stops
        try:
            share.help()
        except OSError as exc:
            errors.append(exc)

    t = threading.Thread(target=helper, name="helper")
    t.start()
    t.join()
    assert len(errors) == 1 and share.lost == {0: SHARE_PIECE} and not share.helping
    hasher = xxhash.xxh3_64()
    share.copy_hashing(memoryview(src).cast("B"), hasher.update)
    assert np.array_equal(src, dst)
    assert hasher.intdigest() == xxhash.xxh3_64_intdigest(src)
    assert not share.lost and not share.copied


def test_large_copies_take_the_way_that_was_faster_lately_and_retry_the_other() -> None:
    helper = CopyHelper()
    mib = 1 << 20
    try:
        if not helper.wanted(True):
            pytest.skip("one CPU: no helper at all")
        # Until both ways have timings, the one with fewer is taken.
        helper.timed(True, True, 1e-3, mib)
        assert helper.wanted(True) is False
        helper.timed(True, False, 2e-3, mib)
        assert helper.wanted(True) is True
        # Reads: shared was faster; writes (timed apart): alone was faster.
        for _ in range(sharedcopy._SAMPLES):
            helper.timed(True, True, 1e-3, mib)
            helper.timed(True, False, 2e-3, mib)
            helper.timed(False, True, 3e-3, mib)
            helper.timed(False, False, 2e-3, mib)
        window = 4 * sharedcopy._EXPLORE
        assert [helper.wanted(True) for _ in range(window)].count(False) == 4  # 1 in _EXPLORE
        assert [helper.wanted(False) for _ in range(window)].count(True) == 4
        # The helper gets slow for reads: recent timings decide.
        for _ in range(sharedcopy._SAMPLES):
            helper.timed(True, True, 5e-3, mib)
        assert [helper.wanted(True) for _ in range(window)].count(True) == 4
    finally:
        helper.close()
    assert not helper.wanted(True)  # closed: no helper
    assert not helper.offer(Share(0, 0, 0))


@pytest.fixture(scope="module")
def one_node(pool_module: PoolFactory) -> Pool:  # noqa: F811
    return pool_module(nodes=1, segment_size="64MiB")


@pytest.fixture
def store(one_node: Pool) -> Iterator[Store]:
    with emptied_after(one_node.address) as s:
        yield s


def _aligned(nbytes: int, past_page: int) -> np.ndarray:
    """A byte array whose data starts `past_page` bytes after a page boundary."""
    raw = np.zeros(nbytes + 8192, np.uint8)
    start = (-raw.ctypes.data) % 4096 + past_page
    return raw[start : start + nbytes]


@pytest.mark.parametrize("past_page", [0, 16, 48, 2048])
@pytest.mark.parametrize("size", [(1 << 20) + 5, (3 << 20) + 4097])
def test_get_into_any_alignment_is_byte_exact_and_verified(
    store: Store, size: int, past_page: int
) -> None:
    src = _aligned(size, (past_page + 512) % 4096)
    src[:] = np.random.default_rng(size + past_page).integers(0, 256, size, dtype=np.uint8)
    dst = _aligned(size, past_page)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        key = f"a{size}-{past_page}"
        assert store.put_from(key, src) is True
        assert store.get_into(key, dst) == size
        assert np.array_equal(src, dst)
        assert xxhash.xxh3_64_intdigest(dst) == xxhash.xxh3_64_intdigest(src)
        assert store.get(key) == src.tobytes()
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)


def test_a_batch_spread_over_two_segments_reads_back_byte_exact(
    pool_module: PoolFactory,  # noqa: F811
) -> None:
    pool = pool_module(nodes=2, segment_size="16MiB")
    with Store(pool.address) as s:
        keys = [f"m{i}" for i in range(40)]
        values = [bytes([i]) * (4096 + i) for i in range(40)]
        for half, endpoint in enumerate(pool.node_endpoints):
            cfg = ReplicateConfig(preferred_segments=[endpoint + "/0"])
            part = slice(half * 20, half * 20 + 20)
            assert all(c == ErrorCode.OK for c in s.batch_put(keys[part], values[part], cfg))
        with RpcClient(pool.address, response_type=Response) as rpc:
            segments = {
                rpc.call_as(GetReplicaList(k), ReplicaListReply).replicas[0].segment for k in keys
            }
        assert len(segments) == 2
        assert [bytes(g or b"") for g in s.batch_get(keys)] == values
        s.remove_all(force=True)


@pytest.mark.parametrize("past_page", [0, 16, 2048])
@pytest.mark.parametrize("size", _SHARED_SIZES)
def test_large_values_round_trip_byte_exact_with_the_checksum_of_the_whole_value(
    one_node: Pool, store: Store, size: int, past_page: int
) -> None:
    src = _random(size, (past_page + 48) % 4096, size + past_page)
    dst = _aligned(size, past_page)
    store.register_buffer(src)
    store.register_buffer(dst)
    try:
        key = f"big{size}-{past_page}"
        assert store.put_from(key, src) is True
        with RpcClient(one_node.address, response_type=Response) as rpc:
            recorded = rpc.call_as(GetReplicaList(key), ReplicaListReply).checksum
        assert recorded == xxhash.xxh3_64_intdigest(src)
        assert store.get_into(key, dst) == size  # verifies the checksum
        assert np.array_equal(src, dst)
    finally:
        store.unregister_buffer(src)
        store.unregister_buffer(dst)


def test_closing_the_store_stops_the_copy_helper(one_node: Pool) -> None:
    before = {t for t in threading.enumerate() if t.name == "kvpool-copy-helper"}
    value = np.ones(SHARED_MIN, np.uint8)
    with Store(one_node.address) as s:
        try:
            s.register_buffer(value)
            for i in range(3):
                assert s.put_from(f"helper-{i}", value) is True
        finally:
            s.remove_all(force=True)
    after = {t for t in threading.enumerate() if t.name == "kvpool-copy-helper"}
    assert after <= before


# ---------------------------------------------------------------- segment locations


class _GatedGetSegment:
    """Holds every GetSegment of `store` until `release` is set, counting them; the rest of
    the Store's calls pass. Undone by `close`."""

    def __init__(self, store: Store) -> None:
        self.rpc = store._node.rpc
        self.calls = 0
        self.release = threading.Event()
        real = self.rpc.call

        def call(req: Any, *a: Any, **kw: Any) -> Any:
            if isinstance(req, GetSegment):
                self.calls += 1
                assert self.release.wait(timeout=30), "never released"
            return real(req, *a, **kw)

        self.rpc.call = call  # type: ignore[method-assign]

    def close(self) -> None:
        self.release.set()
        self.rpc.__dict__.pop("call", None)


def _parked(thread: threading.Thread) -> bool:
    """Whether `thread` is blocked waiting on a threading primitive (an Event, a Condition)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


def test_a_missed_segment_is_asked_once_while_the_others_wait(store: Store, one_node: Pool) -> None:
    data = store._open()
    name = one_node.node_endpoints[0] + "/0"
    data.forget(name)  # not known here: the next use asks the master
    gate = _GatedGetSegment(store)
    got: dict[str, SegmentLocation] = {}
    threads = [
        threading.Thread(target=lambda t=t: got.__setitem__(t, data.resolve(name)))
        for t in ("first", "second")
    ]
    try:
        threads[0].start()
        wait_until(lambda: gate.calls == 1, what="the first resolve asking the master")
        threads[1].start()
        # The second either waits for the first's answer or asks too (the defect).
        wait_until(lambda: gate.calls == 2 or _parked(threads[1]), what="the second resolve")
    finally:
        gate.close()
        for t in threads:
            if t.ident is not None:
                t.join(timeout=30)
    assert gate.calls == 1
    assert got["first"] == got["second"] and got["first"].name == name


def test_a_forget_during_a_resolve_wins(store: Store, one_node: Pool) -> None:
    data = store._open()
    name = one_node.node_endpoints[0] + "/0"
    data.forget(name)
    gate = _GatedGetSegment(store)
    got: list[SegmentLocation] = []
    asking = threading.Thread(target=lambda: got.append(data.resolve(name)))
    try:
        asking.start()
        wait_until(lambda: gate.calls == 1, what="the resolve asking the master")
        data.forget(name)  # a transfer failed meanwhile: what is being asked may be stale
        gate.release.set()
        asking.join(timeout=30)
        assert got and got[0].name == name  # the caller still gets the master's answer...
        data.resolve(name)
        assert gate.calls == 2  # ...but it was not cached: the next use asks again
    finally:
        gate.close()
        asking.join(timeout=30)


def test_a_failed_resolve_fails_every_waiter_with_the_masters_answer(
    store: Store,
) -> None:
    data = store._open()
    gate = _GatedGetSegment(store)
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            data.resolve("127.0.0.1:1/404")
        except KVPoolError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(2)]
    try:
        threads[0].start()
        wait_until(lambda: gate.calls == 1, what="the first resolve asking the master")
        threads[1].start()
        wait_until(lambda: gate.calls == 2 or _parked(threads[1]), what="the second resolve")
    finally:
        gate.close()
        for t in threads:
            if t.ident is not None:
                t.join(timeout=30)
    assert [e.code for e in errors] == [ErrorCode.SEGMENT_NOT_FOUND] * 2
    assert gate.calls == 1
