"""Engine environments for tests/engines (docs/engines.md).

Each engine runs in its own virtual environment, built once outside the repository by
`scripts/engines/build ENGINE` under $KVPOOL_ENGINES_CACHE (default ~/.cache/kvpool-engines);
`make test-engines` builds them all and runs this package. A test that needs an engine takes
`engine("sglang")` (or lmcache, vllm): without that environment the test is skipped with the
command that builds it, so the default `make test` run never needs an engine.

Drivers (tests/engines/drivers/*.py) are the code that runs inside an engine environment: the
test starts one as a child process with this checkout's src/ (kvpool, kvpool.engines) and
compat/mooncake-shim/src (the `mooncake` module) on PYTHONPATH, so an engine always runs
against the code under test, and reads the one JSON line it prints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvtest.pool import Pool, start_pool
from kvtest.procs import Proc, wait_until

REPO = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "drivers"
STAMP = ".kvpool-built"


def engines_cache() -> Path:
    return Path(os.environ.get("KVPOOL_ENGINES_CACHE", Path.home() / ".cache/kvpool-engines"))


@dataclass
class EngineEnv:
    """An engine's environment: its python, and the children started with it (stopped after
    the test)."""

    name: str
    python: Path
    started: list[Proc] = field(default_factory=list)

    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO / "src"), str(REPO / "compat/mooncake-shim/src"), str(DRIVERS)]
        )
        env["PYTHONHASHSEED"] = "0"  # LMCache's chunk keys use Python's hash across processes
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def start(self, script: str, *args: str, **extra_env: str) -> Proc:
        proc = Proc(
            [str(self.python), str(DRIVERS / script), *args],
            env=self.environ(**extra_env),
            name=f"{self.name} {script} {' '.join(args[:1])}",
        )
        self.started.append(proc)
        return proc

    def run(
        self, script: str, *args: str, timeout: float = 180.0, **extra_env: str
    ) -> dict[str, Any]:
        """Run a driver to its end; its JSON line when it exits 0, else fail with its output."""
        proc = self.start(script, *args, **extra_env)
        wait_until(
            lambda: not proc.alive(), timeout=timeout, interval=0.05, what=f"{script} to exit"
        )
        code = proc.stop()
        lines = [ln for ln in proc.output(400).splitlines() if ln.startswith("{")]
        assert code == 0 and lines, f"{script} {' '.join(args)} exited {code}:\n{proc.output(60)}"
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def stop_all(self) -> None:
        for proc in self.started:
            proc.stop()


def engine_python(name: str) -> Path | None:
    venv = engines_cache() / name
    python = venv / "bin" / "python"
    if not (venv / STAMP).is_file() or not python.is_file():
        return None
    return python


def _skip_reason(name: str) -> str:
    return (
        f"the {name} environment is not built: scripts/engines/build {name} "
        f"(make test-engines; {engines_cache()})"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine(name): needs that engine's environment")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked `engine(NAME)` before its fixtures start a pool."""
    for mark in item.iter_markers("engine"):
        if engine_python(mark.args[0]) is None:
            pytest.skip(_skip_reason(mark.args[0]))


@pytest.fixture
def engine() -> Iterator[Callable[[str], EngineEnv]]:
    """`engine("lmcache")`: that engine's environment, or skip when it is not built."""
    envs: list[EngineEnv] = []

    def get(name: str) -> EngineEnv:
        python = engine_python(name)
        if python is None:
            pytest.skip(_skip_reason(name))
        env = EngineEnv(name, python)
        envs.append(env)
        return env

    try:
        yield get
    finally:
        for env in envs:
            env.stop_all()


@pytest.fixture(scope="module")
def live_pool() -> Iterator[Pool]:
    """A master and one 256 MiB node on loopback, shared by a module's tests."""
    pool = start_pool(nodes=1, segment_size="256MiB", client_ttl="10s")
    try:
        yield pool
    finally:
        pool.stop()
