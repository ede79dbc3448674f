"""`kvpool master`'s HA flags, kvpool's and Mooncake's spellings: what they start, what they
refuse (before binding anything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpool.cli.master import master
from kvtest.etcd import EtcdServer
from kvtest.ha import role
from kvtest.procs import kvpool_proc, wait_until


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ha", "etcd://127.0.0.1:2379"], "no cluster id"),
        (["--ha", "etcd://127.0.0.1:2379/a", "--cluster-id", "b"], "differs"),
        (["--enable_ha"], "--etcd_endpoints"),
        (["--etcd_endpoints", "127.0.0.1:2379"], "--enable_ha"),
        (["--enable_snapshot"], "--data-dir"),
        (["--ha", "etcd://127.0.0.1:2379/a", "--host", "0.0.0.0"], "--advertise"),
        (["--ha", "etcd://127.0.0.1:2379/a", "--ha-lease-ttl", "1"], "--ha-lease-ttl"),
    ],
)
def test_bad_ha_flags_are_refused_naming_the_flag(args: list[str], message: str) -> None:
    out = CliRunner().invoke(master, ["--port", "0", *args])
    assert out.exit_code == 2, out.output
    assert message in out.output


def test_mooncake_flags_start_an_ha_master_of_the_named_cluster(
    etcd_shared: EtcdServer, cluster: str, tmp_path: Path
) -> None:
    proc = kvpool_proc(
        "master",
        "--port",
        "0",
        "--enable_ha",
        "--etcd_endpoints",
        f"{etcd_shared.endpoint};127.0.0.1:1",
        "--cluster_id",
        cluster,
        "--enable_snapshot",
        "--data-dir",
        str(tmp_path / "meta"),
        "--snapshot_interval_seconds",
        "5",
        name="mooncake-style master",
    )
    try:
        address = proc.wait_ready(timeout=30)
        status = wait_until(
            lambda: (s := role(address, cluster)) is not None and s.role == "leader" and s,
            15,
            what="the master to lead",
        )
        assert status.term >= 1 and status.leader == address
        assert any(p.name.startswith("snapshot-") for p in (tmp_path / "meta").iterdir())
    finally:
        proc.stop()
