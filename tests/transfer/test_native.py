"""The fused copy-and-checksum (`kvpool.transfer.native`): the same xxh3_64 as python-xxhash,
bit for bit, at every length and alignment; exactly the bytes asked for copied; the digest of
what the destination holds even while the source changes; a library that is missing, stale or
wrong is refused and the Python path takes over.

Its speed is measured by benchmarks (`benchmarks/fast_paths.py`), never asserted here.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.transfer import native
from kvpool.transfer.native import MIN_BYTES, build

MiB = 1 << 20


@pytest.fixture(scope="module", params=["best", "scalar"])
def copy_xxh3(request: pytest.FixtureRequest) -> Iterator[object]:
    """The fused copy on the path this CPU takes, and on the scalar one (CPUs without AVX2)."""
    if native.copy_xxh3 is None or native._use_path is None:
        if os.environ.get("KVPOOL_REQUIRE_NATIVE") == "1":
            pytest.fail(f"the fused copy is required here but is {native.copy_path}")
        pytest.skip(f"the fused copy is {native.copy_path}")
    took = native._use_path(1 if request.param == "scalar" else 0)
    assert (took == 1) == (request.param == "scalar" or native.copy_path == "scalar")
    try:
        yield native.copy_xxh3
    finally:
        native._use_path(0)


def _buffers(n: int, pad: int = 256) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    src = rng.integers(0, 256, n + 2 * pad, dtype=np.uint8)
    dst = np.full(n + 2 * pad, 0xA5, np.uint8)
    return src, dst


def _check(fn, n: int, s_off: int, d_off: int, stream: int = 0) -> None:  # type: ignore[no-untyped-def]
    pad = 256
    src, dst = _buffers(n, pad)
    s, d = pad + s_off, pad + d_off
    got = fn(dst.ctypes.data + d, src.ctypes.data + s, n, stream)
    assert got == xxhash.xxh3_64_intdigest(memoryview(src)[s : s + n])
    assert np.array_equal(dst[d : d + n], src[s : s + n])
    assert (dst[:d] == 0xA5).all() and (dst[d + n :] == 0xA5).all()  # nothing outside


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(MIN_BYTES, 20_000),
    s_off=st.integers(-64, 64),
    d_off=st.integers(-64, 64),
    stream=st.sampled_from([0, 1]),
)
def test_digest_and_bytes_match_xxhash_at_any_length_and_alignment(
    copy_xxh3: object, n: int, s_off: int, d_off: int, stream: int
) -> None:
    """`stream` (non-temporal stores) applies where the destination is 32-byte aligned;
    either way the same bytes and digest."""
    _check(copy_xxh3, n, s_off, d_off, stream)


@pytest.mark.parametrize(
    "n",
    [MIN_BYTES, 1023, 1024, 1025, 1024 + 64, 2048, 4096, 64 * 1024 - 1, MiB, MiB + 1, 4 * MiB - 7],
)
@pytest.mark.parametrize("stream", [0, 1])
def test_block_and_stripe_boundaries(copy_xxh3: object, n: int, stream: int) -> None:
    _check(copy_xxh3, n, 0, 16, stream)
    _check(copy_xxh3, n, 0, 0, stream)  # (the buffers' pad is 256: aligned as numpy's start)


def test_shorter_than_the_minimum_copies_nothing(copy_xxh3: object) -> None:
    src, dst = _buffers(MIN_BYTES)
    assert copy_xxh3(dst.ctypes.data, src.ctypes.data, MIN_BYTES - 1, 0) == 0  # type: ignore[operator]
    assert (dst == 0xA5).all()


def test_the_digest_is_of_what_the_destination_holds_while_the_source_changes(
    copy_xxh3: object,
) -> None:
    """A torn read: another thread rewrites the source during the copy (ctypes and numpy both
    let go of the GIL). Whatever mix of old and new bytes lands in the destination, the digest
    answered is the destination's: a reader comparing it with the recorded checksum can never
    accept bytes it did not check."""
    n = 8 * MiB
    src = np.zeros(n, np.uint8)
    dst = np.zeros(n, np.uint8)
    stop = threading.Event()

    def scribble() -> None:
        v = 0
        while not stop.is_set():
            v = (v + 1) & 0xFF
            src.fill(v)

    t = threading.Thread(target=scribble, daemon=True)
    t.start()
    try:
        for i in range(40):
            got = copy_xxh3(dst.ctypes.data, src.ctypes.data, n, i % 2)  # type: ignore[operator]
            assert got == xxhash.xxh3_64_intdigest(dst)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()


def test_read_new_answers_a_copy_and_its_digest(copy_xxh3: object) -> None:
    src = np.random.default_rng(3).integers(0, 256, 70_001, dtype=np.uint8)
    out, digest = native.read_new(src.ctypes.data, src.size)
    assert isinstance(out, bytearray) and bytes(out) == src.tobytes()
    assert digest == xxhash.xxh3_64_intdigest(out)


def test_new_bytearray_has_the_length_asked() -> None:
    for n in (0, 1, 4096, MiB):
        b = native.new_bytearray(n)
        assert isinstance(b, bytearray) and len(b) == n
        b[-1:] = b"x" if n else b""


def _python(env: dict[str, str], *args: str) -> str:
    """What a fresh interpreter prints (the library is loaded once, at import) with `env`."""
    out = subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_kvpool_native_0_turns_it_off() -> None:
    prog = "from kvpool.transfer import native; print(native.copy_path)"
    assert _python({"KVPOOL_NATIVE": "0"}, "-c", prog) == "off (KVPOOL_NATIVE=0)"


def _cc() -> str:
    cc = build.compiler()
    if cc is None:
        if os.environ.get("KVPOOL_REQUIRE_NATIVE") == "1":
            pytest.fail("no C compiler, and the fused copy is required here")
        pytest.skip("no C compiler")
    return cc


def test_build_compiles_a_library_that_loads_and_matches(tmp_path: Path) -> None:
    _cc()
    out = tmp_path / "lib.so"
    assert build.main(["--out", str(out), "--quiet"]) == 0
    lib = ctypes.CDLL(str(out))
    assert lib.kv_copyhash_version() == native._VERSION
    fn = lib.kv_copy_xxh3
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_uint64
    _check(fn, 5000, 3, 7)
    assert not build.stale(out)
    assert native.LIBRARY == build.LIBRARY  # where the loader looks is where make builds
    assert build.main(["--out", str(out), "--if-stale", "--quiet"]) == 0


_BOGUS = """
#include <stddef.h>
#include <stdint.h>
#include <string.h>
int kv_copyhash_version(void) { return VERSION; }
int kv_copyhash_path(void) { return 1; }
int kv_copyhash_use(int path) { return 1; }
uint64_t kv_copy_xxh3(void *d, const void *s, size_t n, int m) { memcpy(d, s, n); return 42; }
"""


@pytest.mark.parametrize(
    ("version", "why"),
    [
        (native._VERSION - 1, "off (_copyhash.so is of another version: rebuild it)"),
        (native._VERSION, "off (failed its self-check)"),
    ],
)
def test_a_stale_or_wrong_library_is_refused(tmp_path: Path, version: int, why: str) -> None:
    cc = _cc()
    src = tmp_path / "bogus.c"
    src.write_text(_BOGUS.replace("VERSION", str(version)))
    lib = tmp_path / "_copyhash.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    fn, path, _ = native._load(lib)
    assert fn is None and path == why


def test_without_a_compiler_the_build_says_so_and_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No compiler is not an error (kvpool then hashes in Python); a broken one is."""
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    out = tmp_path / "lib.so"
    assert build.main(["--out", str(out)]) == 0
    assert "no C compiler" in capsys.readouterr().err
    assert not out.exists()
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert build.main(["--out", str(out), "--cc", str(broken)]) == 1
    assert "broken" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".copyhash-*"))  # no half-built file


def test_kvpool_version_says_which_fused_copy_runs() -> None:
    off = _python({"KVPOOL_NATIVE": "0"}, "-m", "kvpool", "--version")
    assert off.endswith("(fused copy: off (KVPOOL_NATIVE=0))")
    on = _python({}, "-m", "kvpool", "--version")
    assert on.endswith(f"(fused copy: {native.copy_path})")
