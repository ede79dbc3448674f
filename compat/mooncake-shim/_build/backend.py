"""PEP 517 build backend of kvpool-mooncake-shim: a pure-Python wheel, and a refusal.

Why a backend of its own: the shim must not be installed into an environment that has the real
Mooncake wheel (both own the `mooncake` package directory; one over the other breaks both), and
the only moment an installer runs project code is the build. So every hook that pip calls
before installing (`prepare_metadata_for_build_wheel`, `build_wheel`, `build_editable`) first
asks the target interpreter whether a real Mooncake is importable, and raises with an
explanation if it is. It needs nothing but the standard library, so it works offline and with
`--no-build-isolation`.

The target interpreter is `sys.executable` (pip runs the backend with the interpreter it
installs for), asked in isolated mode (`-I`), so pip's build isolation cannot hide the
environment's site-packages from the check.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TAG = "py3-none-any"

_PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json
dists = sorted({d.metadata["Name"] for d in md.distributions()
                if (d.metadata["Name"] or "").lower().replace("_", "-").startswith("mooncake")})
spec = iu.find_spec("mooncake")
origin = None
if spec is not None and spec.submodule_search_locations:
    origin = list(spec.submodule_search_locations)
shim = False
if spec is not None and spec.origin:
    try:
        shim = "__kvpool_shim__" in open(spec.origin, encoding="utf-8").read()
    except OSError:
        pass
print(json.dumps({"dists": dists, "found": spec is not None, "shim": shim, "where": origin}))
"""


class RealMooncakeInstalled(RuntimeError):
    """The target environment has the real Mooncake: installing the shim would break it."""


def _project() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def check_target(python: str | None = None) -> None:
    """Raise RealMooncakeInstalled when `python`'s environment has a Mooncake other than us."""
    exe = python or sys.executable
    out = subprocess.run(
        [exe, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    found = json.loads(out)
    real = [d for d in found["dists"] if d.lower().replace("_", "-") != "kvpool-mooncake-shim"]
    if real or (found["found"] and not found["shim"]):
        what = ", ".join(real) if real else f"a `mooncake` package at {found['where']}"
        raise RealMooncakeInstalled(
            f"kvpool-mooncake-shim will not install into {exe}: the real Mooncake is installed "
            f"there ({what}). Both own the `mooncake` package, and installing one over the other "
            "breaks both. Uninstall it first (pip uninstall "
            + (real[0] if real else "mooncake")
            + "), use a separate environment, or import kvpool.compat.mooncake instead."
        )


def _dist_name() -> str:
    return str(_project()["name"]).replace("-", "_")


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
        f"Requires-Python: {p['requires-python']}",
    ]
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]  # type: ignore[attr-defined]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines += ["Description-Content-Type: text/markdown", "", readme]
    return "\n".join(lines)


def _dist_info() -> str:
    return f"{_dist_name()}-{_project()['version']}.dist-info"


def _write_dist_info(directory: Path) -> dict[str, bytes]:
    files = {
        "METADATA": _metadata().encode(),
        "WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: kvpool-mooncake-shim backend\n"
            f"Root-Is-Purelib: true\nTag: {TAG}\n"
        ).encode(),
        "top_level.txt": b"mooncake\n",
    }
    scripts = _project().get("scripts") or {}
    if scripts:
        lines = ["[console_scripts]"] + [f"{k} = {v}" for k, v in scripts.items()]  # type: ignore[attr-defined]
        files["entry_points.txt"] = ("\n".join(lines) + "\n").encode()
    out = directory / _dist_info()
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return files


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


# ------------------------------------------------------------------------------ PEP 517 hooks


def get_requires_for_build_wheel(config_settings: object = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: object = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: object = None
) -> str:
    check_target()
    _write_dist_info(Path(metadata_directory))
    return _dist_info()


def build_wheel(
    wheel_directory: str, config_settings: object = None, metadata_directory: object = None
) -> str:
    check_target()
    name = f"{_dist_name()}-{_project()['version']}-{TAG}.whl"
    dist_info = _dist_info()
    files: list[tuple[str, bytes]] = []
    for path in sorted((SRC / "mooncake").glob("*.py")):
        files.append((f"mooncake/{path.name}", path.read_bytes()))
    for meta_name, data in _write_dist_info(Path(wheel_directory) / ".meta").items():
        files.append((f"{dist_info}/{meta_name}", data))
    record = [_record_line(p, d) for p, d in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    target = Path(wheel_directory) / name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files:
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    _remove_tree(Path(wheel_directory) / ".meta")
    return name


def build_editable(
    wheel_directory: str, config_settings: object = None, metadata_directory: object = None
) -> str:
    # An editable install of the shim is a normal one: it is a few re-exporting modules.
    return build_wheel(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: object = None
) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()


if __name__ == "__main__":  # `python _build/backend.py check [PYTHON]`: run only the check
    try:
        check_target(sys.argv[2] if len(sys.argv) > 2 else None)
    except RealMooncakeInstalled as exc:
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(1) from None
    sys.stdout.write("no real Mooncake in the target environment\n")
