"""SegmentMemory: pre-faulted memfd segments, their lifecycle, quarantine, and no leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kvpool.errors import InvalidParams
from kvpool.transfer import SegmentLocation, SegmentMemory, host_id, quarantined_count
from kvpool.transfer.memory import open_peer_mapping, retry_quarantined
from kvtest.procs import wait_until


def test_create_gives_a_writable_pre_faulted_segment() -> None:
    with SegmentMemory.create("/seg-a", "4MiB") as mem:
        assert mem.name == "seg-a"  # leading '/' stripped
        assert mem.size == 4 << 20
        assert mem.buffer.nbytes == mem.size and not mem.buffer.readonly
        mem.buffer[100:104] = b"abcd"
        assert bytes(mem.buffer[100:104]) == b"abcd"
        assert mem.shm_path == f"/proc/{os.getpid()}/fd/{mem._fd}"
        # Pre-faulted: every page is already resident in this process's mapping.
        rss_kb = _mapping_rss_kb(mem.shm_path)
        assert rss_kb >= (4 << 20) // 1024


def _mapping_rss_kb(shm_path: str) -> int:
    target = os.readlink(shm_path).removesuffix(" (deleted)")
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if target in line:
            for follow in lines[i + 1 : i + 20]:
                if follow.startswith("Rss:"):
                    return int(follow.split()[1])
    raise AssertionError(f"{target} not in smaps")


@pytest.mark.parametrize("name", ["", "/", "//", "a\x00b", "x" * 300, 7])
def test_bad_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidParams):
        SegmentMemory.create(name, 4096)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, "0B", "lots"])
def test_bad_sizes_are_refused(size: object) -> None:
    with pytest.raises(InvalidParams):
        SegmentMemory.create("s", size)  # type: ignore[arg-type]


def test_close_runs_hooks_first_then_unmaps_and_is_idempotent(
    closing: Callable[[Any], Any],
) -> None:
    mem = closing(SegmentMemory.create("hooks", 4096))
    seen: list[bool] = []
    mem.add_close_hook(lambda m: seen.append(m.mapping.closed))
    mem.close()
    mem.close()
    assert seen == [False]  # the hook ran while the memory was still mapped
    assert mem.mapping.closed
    assert not os.path.exists(mem.shm_path)


def test_a_held_segment_is_quarantined_until_released(closing: Callable[[Any], Any]) -> None:
    mem = closing(SegmentMemory.create("held", 8192))
    mem.buffer[:5] = b"hello"
    assert mem.mapping.acquire()
    mem.close()
    assert mem.mapping.quarantined and quarantined_count() >= 1
    assert not mem.mapping.acquire()  # no new transfer may start on it
    assert bytes(mem.mapping.view[:5]) == b"hello"  # still mapped for the holder
    mem.mapping.release()
    assert mem.mapping.closed and not mem.mapping.quarantined


def test_an_exported_view_keeps_the_mapping_quarantined_until_retried(
    closing: Callable[[Any], Any],
) -> None:
    mem = closing(SegmentMemory.create("exported", 4096))
    leak = mem.buffer[0:16]  # a slice someone kept past close()
    mem.close()
    assert mem.mapping.quarantined
    leak[0] = 1  # still valid memory, never a dangling pointer
    del leak
    retry_quarantined()
    assert mem.mapping.closed


def test_a_peer_process_sees_the_same_bytes_through_shm_path() -> None:
    with SegmentMemory.create("shared", 1 << 20) as mem:
        mem.buffer[4096:4100] = b"KVPL"
        code = (
            "import mmap,os,sys;fd=os.open(sys.argv[1],os.O_RDWR);"
            "m=mmap.mmap(fd,1<<20);sys.stdout.write(m[4096:4100].decode());m[0:2]=b'ok'"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, mem.shm_path], capture_output=True, text=True, check=True
        )
        assert out.stdout == "KVPL"
        assert bytes(mem.buffer[0:2]) == b"ok"


def test_peer_mapping_verifies_what_it_opens() -> None:
    with SegmentMemory.create("verify", 1 << 16) as mem:
        good = SegmentLocation("verify", 1 << 16, host_id(), "", mem.shm_path)
        peer = open_peer_mapping(good)
        assert peer.owner_alive()
        peer.mapping.close()
        from kvpool.errors import TransferError

        with pytest.raises(TransferError):  # wrong size
            open_peer_mapping(SegmentLocation("verify", 1 << 15, host_id(), "", mem.shm_path))
        with pytest.raises(TransferError):  # a different segment's name at that path
            open_peer_mapping(SegmentLocation("other", 1 << 16, host_id(), "", mem.shm_path))
        with pytest.raises(InvalidParams):
            open_peer_mapping(SegmentLocation("verify", 1 << 16, host_id(), "", "/dev/shm/x"))


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_kill_9_of_the_owner_leaves_nothing_behind(
    spawn_peer: Callable[..., Any], fill_pattern: Callable[[int, int], bytes]
) -> None:
    before = _shm_names()
    peer = spawn_peer("doomed", "8MiB")
    pattern = fill_pattern
    path = peer.location.shm_path
    mapping = open_peer_mapping(peer.location).mapping
    assert bytes(mapping.view[1000:1010]) == pattern(1000, 10)
    # A memfd has no name in /dev/shm at any time (other users of this machine may add theirs).
    assert not _named_after(peer, _shm_names() - before)
    os.kill(peer.pid, signal.SIGKILL)
    peer.proc.popen.wait(timeout=10)
    wait_until(lambda: not os.path.exists(path), timeout=10, what="owner's fd to vanish")
    assert not mapping_owner_alive(peer.pid)
    # Our mapping stays valid (quarantine semantics) until we let go of it.
    assert bytes(mapping.view[1000:1010]) == pattern(1000, 10)
    mapping.close()
    assert not _named_after(peer, _shm_names() - before)
    # Nothing with the owner's pid is reachable through /proc any more.
    with pytest.raises(OSError):
        os.open(path, os.O_RDONLY)


def _named_after(peer: Any, names: set[str]) -> list[str]:
    return [n for n in names if "kvpool" in n or "doomed" in n or str(peer.pid) in n]


def mapping_owner_alive(pid: int) -> bool:
    from kvpool.transfer.memory import process_start_time

    return process_start_time(pid) is not None
