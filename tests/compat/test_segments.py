"""Segments mounted after setup: `mount_segment` (a caller's file), `allocate_and_mount_segment`,
their unmounts (also graceful) and `unmount_local_disk_segment`, on both backends.

The stores that put and read are pure clients (`segment=0`) and every store of a test is closed
when it ends, so the segment a test mounts is the only one in the pool: a put can only land
there, and a lost segment shows as a miss.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from kvtest.procs import wait_until

MiB = 1 << 20


@pytest.fixture
def shm_file(tmp_path: Path) -> Path:
    path = tmp_path / "segment.bin"
    path.write_bytes(b"\x00" * (4 * MiB))
    return path


def test_allocate_and_mount_adds_capacity_and_unmount_and_free_takes_it_away(
    backend: Any,
) -> None:
    owner = backend.store(segment=0)
    client = backend.store(segment=0)
    assert client.put("before", b"v" * 100) == -200  # no segment in the pool yet
    r = owner.allocate_and_mount_segment(MiB)
    assert r["ret"] == 0 and len(r["segment_ids"]) == 1
    assert r["allocated_size"] >= MiB  # Mooncake rounds up to 16 MiB, kvpool to a page
    assert client.put("k", b"hello" * 1000) == 0
    assert client.get("k") == b"hello" * 1000
    assert owner.get("k") == b"hello" * 1000
    assert owner.unmount_segment(r["segment_ids"]) == -1  # not a mount_segment id
    assert owner.unmount_and_free_segment(r["segment_ids"]) == 0
    wait_until(lambda: client.get("k") == b"", timeout=10, what="the replica to go")
    assert client.put("after", b"v" * 100) == -200
    assert owner.unmount_and_free_segment(r["segment_ids"]) == -1  # twice


def test_mount_segment_stores_values_in_the_callers_file(backend: Any, shm_file: Path) -> None:
    owner = backend.store(segment=0)
    client = backend.store(segment=0)
    r = owner.mount_segment(str(shm_file), 2 * MiB, MiB)
    assert r["ret"] == 0 and len(r["segment_ids"]) == 1
    value = bytes(range(251)) * 64
    assert client.put("in-file", value) == 0
    assert client.get("in-file") == value
    (desc,) = client.get_replica_desc("in-file")
    endpoint = desc.get_memory_descriptor().buffer_descriptor.transport_endpoint
    assert endpoint == owner.get_hostname()  # a mounted segment is named after its store
    data = shm_file.read_bytes()
    at = data.find(value)
    assert MiB <= at <= 3 * MiB - len(value)  # inside the mounted range of the file
    assert owner.unmount_and_free_segment(r["segment_ids"]) == -1  # not an allocated id
    assert owner.unmount_segment(r["segment_ids"]) == 0
    wait_until(lambda: client.get("in-file") == b"", timeout=10, what="the replica to go")
    assert owner.unmount_segment(r["segment_ids"]) == -1  # twice
    assert shm_file.stat().st_size == 4 * MiB


def test_refused_mounts_and_unknown_ids(backend: Any, shm_file: Path, tmp_path: Path) -> None:
    s = backend.store(segment=0)
    path = str(shm_file)
    for args in [
        (str(tmp_path / "missing"), MiB),
        ("", 4096),
        (path, 8 * MiB),  # past the end of the file
        (path, 4 * MiB, 4096),  # past the end from the offset
        (path, 4096, 1),  # offset not page-aligned
    ]:
        assert s.mount_segment(*args) == {"ret": -1, "segment_ids": []}, args
    assert s.mount_segment(path, 0) == {"ret": 0, "segment_ids": []}
    assert s.allocate_and_mount_segment(0) == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    assert s.unmount_segment([]) == 0
    assert s.unmount_and_free_segment([]) == 0
    assert s.unmount_segment(["nonsense"]) == -1
    assert s.unmount_and_free_segment(["1-2"]) == -1
    assert s.unmount_local_disk_segment() == 0
    assert s.unmount_local_disk_segment(1) == 0
    for call in [
        lambda: s.unmount_segment("not a list"),
        lambda: s.unmount_segment([], -1),
        lambda: s.allocate_and_mount_segment(-1),
        lambda: s.mount_segment(path, -1),
    ]:
        with pytest.raises(TypeError):
            call()


def test_an_unmount_goes_past_an_unknown_id_and_answers_minus_1(backend: Any) -> None:
    s = backend.store(segment=0)
    first = s.allocate_and_mount_segment(MiB)["segment_ids"]
    second = s.allocate_and_mount_segment(MiB)["segment_ids"]
    assert s.unmount_and_free_segment([*first, "nonsense", *second]) == -1
    assert s.unmount_and_free_segment(first) == -1  # unmounted before the failure
    assert s.unmount_and_free_segment(second) == -1  # and after it
    pending = s.allocate_and_mount_segment(MiB)["segment_ids"]
    assert s.unmount_and_free_segment(pending, 600) == 0
    assert s.unmount_and_free_segment(pending) == -600  # already being unmounted
    assert s.unmount_and_free_segment([*pending, "nonsense"]) == -1  # -1 wins, in any order
    assert s.unmount_and_free_segment(["nonsense", *pending]) == -1


def test_a_graceful_unmount_answers_at_once_and_unmounts_after_the_grace_period(
    backend: Any, shm_file: Path
) -> None:
    owner = backend.store(segment=0)
    client = backend.store(segment=0)
    ids = owner.mount_segment(str(shm_file), MiB)["segment_ids"]
    assert client.put("graceful", b"g" * 3000) == 0
    started = time.monotonic()
    assert owner.unmount_segment(ids, 2) == 0
    assert time.monotonic() - started < 1.0
    assert client.get("graceful") == b"g" * 3000  # still readable in the grace period
    assert owner.unmount_segment(ids, 2) == -600  # already being unmounted
    wait_until(lambda: client.get("graceful") == b"", timeout=20, what="the deadline unmount")


def test_close_unmounts_every_segment_mounted_later(backend: Any, shm_file: Path) -> None:
    owner = backend.store(segment=0)
    client = backend.store(segment=0)
    assert owner.mount_segment(str(shm_file), MiB)["ret"] == 0
    assert client.put("on-file", b"f" * 3000) == 0
    allocated = owner.allocate_and_mount_segment(MiB)["segment_ids"]
    graceful = owner.allocate_and_mount_segment(MiB)["segment_ids"]
    assert owner.unmount_and_free_segment(graceful, 600) == 0  # pending at close
    assert client.put_batch([f"k{i}" for i in range(16)], [b"x" * 1000] * 16) == 0
    started = time.monotonic()
    assert owner.close() == 0
    assert time.monotonic() - started < 10  # did not wait out the grace period
    wait_until(
        lambda: client.get("on-file") == b"" and client.batch_is_exist(["k0", "k15"]) == [0, 0],
        timeout=10,
        what="every segment of the closed store to be unmounted",
    )
    assert client.put("after", b"v" * 100) == -200
    assert allocated  # (mounted, and gone with the store)


def test_a_graceful_unmount_places_nothing_new_on_the_segment(backend: Any, shm_file: Path) -> None:
    """While a segment is unmounted gracefully, new puts land elsewhere (Mooncake's
    GRACEFULLY_UNMOUNTING; kvpool's drain, client/drain.py), so none is lost with it."""
    owner = backend.store(segment=0)
    client = backend.store(segment=0)
    draining = owner.mount_segment(str(shm_file), MiB)["segment_ids"]
    assert client.put("before", b"b" * 3000) == 0  # the only segment: it lands there
    assert owner.allocate_and_mount_segment(MiB)["ret"] == 0
    assert owner.unmount_segment(draining, 3) == 0
    keys = [f"during{i}" for i in range(16)]
    # 16 x 40 KiB: fits in the other segment alone, and would spread over both if allowed.
    assert client.put_batch(keys, [bytes([i]) * (40 << 10) for i in range(16)]) == 0
    wait_until(lambda: client.get("before") == b"", timeout=20, what="the graceful unmount")
    assert client.batch_is_exist(keys) == [1] * 16
    assert [len(client.get(k)) for k in keys] == [40 << 10] * 16
