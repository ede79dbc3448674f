"""Compile copyhash.c into `_copyhash.so` beside it, with the system C compiler.

Run by `make` (before the tests and the main job), by the package's build hook
(`hatch_build.py`, so `pip install` builds it too) and by hand:

    python -m kvpool.transfer.native.build [--cc CC] [--out FILE] [--quiet]

It imports nothing outside the standard library (the build hook loads it by path, before
kvpool is installed), and what only a build needs only when it builds. Without a C compiler
it says so and exits 0: kvpool then copies and hashes in Python (`kvpool.transfer.native`).
A compiler that fails on the file exits 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["LIBRARY", "SOURCE", "build", "main"]

SOURCE = Path(__file__).with_name("copyhash.c")
LIBRARY = Path(__file__).with_name("_copyhash.so")
_FLAGS = ("-O2", "-fPIC", "-shared", "-fvisibility=default", "-std=gnu11", "-Wall", "-Werror")


def compiler(cc: str | None = None) -> str | None:
    """The C compiler to use: `cc`, else $CC, else the first of cc, gcc, clang on PATH."""
    import shutil

    for name in (cc, os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def build(out: Path = LIBRARY, cc: str | None = None) -> Path | None:
    """Compile SOURCE into `out` (written beside it, then renamed over it: a process that
    loads the library meanwhile sees the old file or the new one, never half of one).
    Returns `out`, or None when no compiler is found; raises CalledProcessError when the
    compiler fails."""
    import tempfile

    found = compiler(cc)
    if found is None:
        return None
    fd, tmp = tempfile.mkstemp(prefix=".copyhash-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        cmd = [*found.split(), *_FLAGS, "-o", tmp, str(SOURCE)]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def stale(out: Path = LIBRARY) -> bool:
    """Whether `out` is missing or older than SOURCE."""
    try:
        return out.stat().st_mtime < SOURCE.stat().st_mtime
    except FileNotFoundError:
        return True


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m kvpool.transfer.native.build",
        description="Compile kvpool's fused copy-and-checksum (copyhash.c) into _copyhash.so.",
    )
    ap.add_argument("--cc", help="C compiler command (default: $CC, cc, gcc or clang)")
    ap.add_argument("--out", type=Path, default=LIBRARY, help=f"library path (default {LIBRARY})")
    ap.add_argument(
        "--if-stale", action="store_true", help="only when missing or older than the source"
    )
    ap.add_argument("--quiet", action="store_true", help="print nothing on success")
    args = ap.parse_args(argv)
    if args.if_stale and not stale(args.out):
        return 0
    try:
        built = build(args.out, args.cc)
    except subprocess.CalledProcessError as exc:
        print(f"kvpool: compiling {SOURCE.name} failed:\n{exc.stderr}", file=sys.stderr)
        return 1
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"kvpool: compiling {SOURCE.name} failed: {exc}", file=sys.stderr)
        return 1
    if built is None:
        print(
            "kvpool: no C compiler (cc, gcc, clang); copies are checksummed in Python instead",
            file=sys.stderr,
        )
        return 0
    if not args.quiet:
        print(f"built {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
