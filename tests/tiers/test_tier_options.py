"""The disk tier's check as options of `kvpool node` and `kvpool up` (`--disk-check-interval`,
`--disk-check-per-round`, `--disk-check-bytes-per-round`; docs/parts/tiers.md): bad values are
refused with a usage error naming the option, good ones reach the node's `DiskTier`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.errors import InvalidParams
from kvpool.protocol.messages import ReplicaKind
from kvtest.disk import add_disk_node, offload_pool, spoil_disk_copy, wait_offloaded
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import kvpool_up, run_kvpool, wait_until
from kvtest.replicas import kinds
from kvtest.stores import open_store
from kvtest.values import MiB

MEM, DISK = ReplicaKind.MEMORY, ReplicaKind.LOCAL_DISK

BAD = [
    ("--disk-check-interval", "2h"),
    ("--disk-check-interval", "-1s"),
    ("--disk-check-interval", "soon"),
    ("--disk-check-per-round", "0"),
    ("--disk-check-bytes-per-round", "0"),
    ("--disk-check-bytes-per-round", "lots"),
]


@pytest.mark.parametrize(("option", "bad"), BAD)
@pytest.mark.parametrize("command", ["node", "up"])
def test_bad_disk_check_values_are_refused_naming_the_option(
    tmp_path: Path, command: str, option: str, bad: str
) -> None:
    where = ("--master", "127.0.0.1:1") if command == "node" else ("--port", "0")
    out = run_kvpool(command, *where, "--offload-dir", str(tmp_path), option, bad)
    assert out.returncode == 2, out.stderr
    assert option in out.stderr, out.stderr


@pytest.mark.parametrize("command", ["node", "up"])
def test_a_disk_check_option_needs_a_disk_tier(command: str) -> None:
    where = ("--master", "127.0.0.1:1") if command == "node" else ("--port", "0")
    out = run_kvpool(command, *where, "--disk-check-per-round", "4")
    assert out.returncode == 2, out.stderr
    assert "--disk-check-per-round needs --offload-dir" in out.stderr, out.stderr


def test_the_nodes_disk_check_runs_as_told(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    quiet = pool(nodes=0)
    off = add_disk_node(quiet, "16MiB", tmp_path / "off", "8MiB", "--disk-check-interval", "0")
    off.wait_for_line(r"disk tier .*; no background check$")
    p = offload_pool(pool, "eager", "--no-promotion-on-hit")
    disk = tmp_path / "disk"
    node = add_disk_node(
        p,
        "16MiB",
        disk,
        "16MiB",
        "--disk-check-interval",
        "50ms",
        "--disk-check-per-round",
        "1",
        "--disk-check-bytes-per-round",
        "1MiB",
    )
    node.wait_for_line(
        r"disk tier .*; checked every 0\.05 s \(1 object\(s\), 1(\.0)? MiB a round\)$"
    )
    s = open_store(stores, p.address)
    value = b"checked!" * (MiB // 8)
    for i in range(3):
        assert s.put(f"c{i}", value)
    wait_offloaded(s, [f"c{i}" for i in range(3)])
    spoil_disk_copy(s, "c1", disk)
    wait_until(lambda: kinds(s, "c1") == [MEM], timeout=20, what="c1's corrupt disk copy gone")
    assert kinds(s, "c0") == kinds(s, "c2") == [MEM, DISK]
    for i in range(3):
        assert s.get(f"c{i}") == value


def test_up_passes_the_disk_check_to_its_node(tmp_path: Path) -> None:
    up = kvpool_up(
        "--offload-dir",
        str(tmp_path / "disk"),
        "--offload-size",
        "8MiB",
        "--disk-check-interval",
        "250ms",
        "--disk-check-per-round",
        "3",
    )
    try:
        up.wait_ready(timeout=60)

        def node_argv() -> list[str] | None:
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    if ppid != up.pid:
                        continue
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read().decode().split("\0")
                except (OSError, ValueError, IndexError):
                    continue
                if "node" in argv:
                    return argv
            return None

        argv = node_argv()
        assert argv is not None
        i = argv.index("--disk-check-interval")
        assert argv[i + 1] == "0.25"
        assert argv[argv.index("--disk-check-per-round") + 1] == "3"
        assert "--disk-check-bytes-per-round" not in argv
    finally:
        up.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"disk_check_interval": -1}, "disk_check_interval"),
        ({"disk_check_interval": 7200}, "disk_check_interval"),
        ({"disk_check_interval": "1s"}, "disk_check_interval"),
        ({"disk_check_per_round": 0}, "disk_check_per_round"),
        ({"disk_check_bytes_per_round": 0}, "disk_check_bytes_per_round"),
        ({"disk_check_bytes_per_round": "lots"}, "disk_check_bytes_per_round"),
    ],
)
def test_a_store_refuses_bad_disk_check_settings(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParams, match=message):
        Store(
            "127.0.0.1:1",
            segment_size="16MiB",
            offload_dir=str(tmp_path),
            offload_size="8MiB",
            **kwargs,  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidParams, match="needs offload_dir"):
        Store("127.0.0.1:1", disk_check_per_round=3)


def test_a_stores_disk_tier_is_checked_as_told(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    p = offload_pool(pool, "eager", "--no-promotion-on-hit")
    disk = tmp_path / "disk"
    owner = open_store(
        stores,
        p.address,
        segment_size="16MiB",
        offload_dir=str(disk),
        offload_size="16MiB",
        disk_check_interval=0.05,
        disk_check_per_round=1,
        disk_check_bytes_per_round="1MiB",
    )
    tier = owner.disk_tier
    assert tier is not None
    value = b"storechk" * (MiB // 8)
    for i in range(3):
        assert owner.put(f"s{i}", value)
    wait_offloaded(owner, [f"s{i}" for i in range(3)])
    # One object a round, every 50 ms: many rounds soon (the default is one a second).
    wait_until(lambda: tier.stats.checked >= 10, timeout=20, what="ten rounds of one object")
    idle = open_store(
        stores,
        p.address,
        segment_size="16MiB",
        offload_dir=str(tmp_path / "idle"),
        offload_size="8MiB",
        disk_check_interval=0,
    )
    assert idle.disk_tier is not None
    assert idle.disk_tier._checker is None  # no check thread at all
