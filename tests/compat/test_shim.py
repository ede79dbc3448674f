"""compat/mooncake-shim: installs `mooncake.store` backed by kvpool, never over the real wheel.

Uses pip itself, offline (--no-index; the shim's backend needs no build requirements), against
a throwaway virtual environment made with `python -m venv --without-pip` under tmp_path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "compat" / "mooncake-shim"


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _real_mooncake_here() -> bool:
    # Asked of a fresh interpreter: what this test process has imported (another test's fake
    # `mooncake` package, say) must not decide what pip will find in the environment.
    code = (
        "import importlib.util, pathlib, sys\n"
        "s = importlib.util.find_spec('mooncake')\n"
        "ok = s is not None and s.origin is not None and "
        "'__kvpool_shim__' not in pathlib.Path(s.origin).read_text(encoding='utf-8')\n"
        "sys.exit(0 if ok else 1)\n"
    )
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_shim_refuses_an_environment_with_the_real_mooncake() -> None:
    if not _real_mooncake_here():
        pytest.skip("the real Mooncake wheel is not installed here (pip install kvpool[bench])")
    # --dry-run: even a broken check cannot install anything into this environment. With
    # pip's build isolation, which hides site-packages from the backend's own process.
    done = _pip("install", "--dry-run", "--no-deps", "--no-index", str(SHIM))
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "will not install" in out and "mooncake-transfer-engine" in out


def test_the_shim_installs_and_serves_mooncake_store_from_kvpool(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = _pip(
        "--python",
        str(python),
        "install",
        "--no-deps",
        "--no-index",
        "--no-build-isolation",
        str(SHIM),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert (Path(site) / "mooncake" / "store.py").is_file()
    # The installed shim, imported by this environment's interpreter (which has kvpool and its
    # dependencies), ahead of any real Mooncake.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import mooncake, mooncake.store as s, mooncake.mooncake_config as c;"
        "import kvpool.compat.mooncake as k;"
        "assert mooncake.__kvpool_shim__;"
        "assert s.MooncakeDistributedStore is k.MooncakeDistributedStore;"
        "assert s.ReplicateConfig is k.ReplicateConfig and c.MooncakeConfig is k.MooncakeConfig;"
        "assert s.COMPLETE is k.ReplicaStatus.COMPLETE and s.KVCACHE is k.ObjectDataType.KVCACHE;"
        "assert s.MooncakeDistributedStore().health_check() == 1;"
        "import mooncake.async_store as a;"
        "assert a.MooncakeDistributedStoreAsync is k.MooncakeDistributedStoreAsync;"
        "import mooncake.cli, mooncake.http_metadata_server as h, kvpool.cli.mooncake_master as m;"
        "assert mooncake.cli.main is m.main and callable(h.main);"
        "import mooncake.mooncake_store_service as svc, kvpool.compat.mooncake_service as ks;"
        "assert svc.main is ks.main and callable(svc.sync_main);"
        "import mooncake.cli_client as cc, kvpool.compat.mooncake_client as kc;"
        "assert cc.main is kc.main;"
        "assert s._tensor_metadata_size() == 304;"
        "import importlib.util, mooncake.engine as e, kvpool.compat.mooncake.transfer_engine as te;"
        "assert importlib.util.find_spec('mooncake.engine') is not None;"
        "assert e.TransferEngine is te.TransferEngine;"
        "assert s.bind_to_numa_node is k.bind_to_numa_node;"
        "print('ok')"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe, site], capture_output=True, text=True, check=False
    )
    assert ran.stdout.strip() == "ok", ran.stderr
    # Mooncake's commands, under Mooncake's names.
    for script, module in (
        ("mooncake_master", "mooncake.cli"),
        ("mooncake_client", "mooncake.cli_client"),
        ("mooncake_http_metadata_server", "mooncake.http_metadata_server"),
        ("mc_store_rest_server", "mooncake.mooncake_store_service"),
    ):
        path = venv / "bin" / script
        assert path.is_file(), f"{script} was not installed"
        assert module in path.read_text(encoding="utf-8")
    # Installed once, the shim is no obstacle to itself (upgrades, reinstalls).
    check = subprocess.run(
        [sys.executable, str(SHIM / "_build" / "backend.py"), "check", str(python)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
