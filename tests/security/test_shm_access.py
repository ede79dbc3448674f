"""Which processes can map a segment through shared memory (docs/security.md, "Data plane").

A segment is a memfd with no name in any file system; a same-host peer opens it through
`/proc/<owner pid>/fd/<fd>` (its `shm_path`), which the kernel allows only to processes with
ptrace-read access to the owner: the same user (or root). A child of the owner's user maps it
and reads its bytes; a child dropped to `nobody` cannot even open it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kvpool.transfer import SegmentMemory

SIZE = 1 << 16
_PROBE = """
import mmap, sys
try:
    f = open(sys.argv[1], "rb")
except OSError as exc:
    print("refused", type(exc).__name__)
    sys.exit(0)
with f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    print("mapped", m[:8].hex())
"""


@pytest.fixture
def segment() -> Iterator[SegmentMemory]:
    mem = SegmentMemory.create("shm-access", SIZE)
    mem.buffer[:8] = b"secret!!"
    try:
        yield mem
    finally:
        mem.close()


def _probe(path: str, user: int | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, path],
        capture_output=True,
        text=True,
        timeout=60,
        user=user,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_process_of_the_same_user_maps_the_segment(segment: SegmentMemory) -> None:
    assert _probe(segment.shm_path) == "mapped " + b"secret!!".hex()


def _open_as(path: str, uid: int) -> int:
    """errno of opening `path` in a forked child dropped to `uid` (0: it opened). A fork, not
    an exec: the other user may not be allowed to run this interpreter."""
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        code = 99
        try:
            os.setgid(uid)
            os.setuid(uid)
            fd = os.open(path, os.O_RDONLY)
            os.close(fd)
            code = 0
        except OSError as exc:
            code = exc.errno or 98
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_process_of_another_user_cannot_open_the_segment(segment: SegmentMemory) -> None:
    if os.geteuid() != 0:
        pytest.skip("dropping a child to another user needs root")
    nobody = 65534
    assert _open_as(segment.shm_path, nobody) == errno.EACCES
    assert _open_as(segment.shm_path, 0) == 0  # the same probe, as the owner's user
