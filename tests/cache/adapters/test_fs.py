"""The fs adapter: names that survive any model name, atomic publication, verified loads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from kvpool.cache.adapters.blocking import BlockingAdapter
from kvpool.cache.adapters.fs import FsBackend, key_path
from kvpool.cache.adapters.registry import create_adapter
from kvpool.cache.adapters.threaded import ThreadedAdapter
from kvpool.cache.bitmap import Bitmap
from kvpool.cache.keys import ObjectKey
from kvpool.cache.memory import MemoryLayout, MemoryObj

NASTY_MODELS = [
    "../../etc/passwd",
    ".",
    "..",
    "a/b\\c",
    "模型 v2",
    "x" * 256,
    "@@@",
    "~/.ssh",
    "a%2Fb",
]


def obj(key: ObjectKey, data: bytes) -> MemoryObj:
    o = MemoryObj(key, MemoryLayout.of_bytes(len(data)))
    o.write(data)
    return o


def fs_adapter(base: Path) -> ThreadedAdapter:
    a = create_adapter({"type": "fs", "base_path": str(base)})
    assert isinstance(a, ThreadedAdapter)
    return a


def test_any_model_name_stays_inside_the_base_and_round_trips(tmp_path: Path) -> None:
    base = tmp_path / "l2"
    keys = [ObjectKey(m, 1, b"\x01" * 16, 0, "salt/..") for m in NASTY_MODELS]
    paths = {key_path(base, k) for k in keys}
    assert len(paths) == len(keys)
    for p in paths:
        assert p.resolve().is_relative_to(base.resolve())
        assert all(len(part.encode()) <= 255 for part in p.parts)
    a = fs_adapter(base)
    try:
        drv = BlockingAdapter(a)
        data = [os.urandom(100 + i) for i in range(len(keys))]
        assert drv.store(keys, [obj(k, d) for k, d in zip(keys, data, strict=True)]).ok
        dest = [
            MemoryObj(k, MemoryLayout.of_bytes(len(d))) for k, d in zip(keys, data, strict=True)
        ]
        assert drv.load(keys, dest) == Bitmap(len(keys), len(keys))
        assert [bytes(o.buffer) for o in dest] == data
    finally:
        a.close()
    assert not list((base / ".tmp").iterdir())  # no temp file left behind


def test_corrupted_truncated_or_foreign_files_load_as_misses(tmp_path: Path) -> None:
    a = fs_adapter(tmp_path)
    try:
        drv = BlockingAdapter(a)
        ks = [ObjectKey("m", 0, bytes([i])) for i in range(4)]
        data = [os.urandom(4096) for _ in ks]
        assert drv.store(ks, [obj(k, d) for k, d in zip(ks, data, strict=True)]).ok
        backend = a.backend
        assert isinstance(backend, FsBackend)
        p0, p1, p2 = (backend.path(k) for k in ks[:3])
        raw = bytearray(p0.read_bytes())
        raw[-1] ^= 0xFF  # a bit flip in the payload
        p0.write_bytes(bytes(raw))
        p1.write_bytes(p1.read_bytes()[:-10])  # torn
        p2.write_bytes(backend.path(ks[3]).read_bytes())  # another key's record
        dest = [MemoryObj(k, MemoryLayout.of_bytes(4096)) for k in ks]
        for o in dest:
            o.array[:] = 0
        assert drv.load(ks, dest).get_indices_list() == [3]
        assert bytes(dest[3].buffer) == data[3]
        assert bytes(dest[0].buffer) == bytes(4096)  # refused bytes were never copied in
    finally:
        a.close()


def test_readers_never_see_a_partial_file_while_writers_replace_it(tmp_path: Path) -> None:
    a = fs_adapter(tmp_path)
    key = ObjectKey("m", 0, b"\xaa")
    versions = [bytes([v]) * (1 << 20) for v in range(1, 5)]
    stop = threading.Event()
    errors: list[str] = []
    try:
        drv = BlockingAdapter(a)
        assert drv.store([key], [obj(key, versions[0])]).ok

        def writer() -> None:
            i = 0
            while not stop.is_set() and i < 200:
                drv.store([key], [obj(key, versions[i % 4])])
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            for _ in range(60):
                dest = MemoryObj(key, MemoryLayout.of_bytes(1 << 20))
                if drv.load([key], [dest]) != Bitmap(1, 1):
                    errors.append("a load failed while the key always existed")
                elif bytes(dest.buffer) not in versions:
                    errors.append("a load returned mixed bytes")
        finally:
            stop.set()
            t.join(timeout=30)
    finally:
        a.close()
    assert errors == []


def test_temp_files_of_dead_writers_are_removed_on_open(tmp_path: Path) -> None:
    tmp = tmp_path / ".tmp"
    tmp.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    stale = tmp / f"{dead.stdout.strip()}-abc.tmp"
    stale.write_bytes(b"partial")
    mine = tmp / f"{os.getpid()}-live.tmp"
    mine.write_bytes(b"in progress")
    FsBackend(str(tmp_path)).close()
    assert not stale.exists()
    assert mine.exists()  # a live writer's file is left alone
