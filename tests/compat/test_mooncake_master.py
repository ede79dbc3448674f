"""`mooncake_master`: Mooncake's master flags (gflags syntax, Mooncake's units) on a kvpool master.

The flag reading and translation are checked as functions (kvpool.compat.mooncake_flags); then
a real `mooncake_master` process, started with a deployment-style command line, serves the
compat API, and its 500 ms lease shows the milliseconds were read as milliseconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpool.cli.mooncake_master import kvpool_master_argv
from kvpool.compat.mooncake_flags import (
    FLAGS,
    Support,
    flag_table_markdown,
    load_config_file,
    mooncake_etcd_url,
    parse_argv,
    parse_duration_ms,
    translate,
)
from kvpool.errors import InvalidParams
from kvtest.procs import Proc, free_port, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compat.md"


def _argv(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return kvpool_master_argv(list(args), env=env or {})


def _opt(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# ------------------------------------------------------------------ gflags syntax


@pytest.mark.parametrize(
    "args",
    [
        ["--eviction_ratio=0.2"],
        ["--eviction_ratio", "0.2"],
        ["-eviction_ratio=0.2"],
        ["-eviction_ratio", "0.2"],
    ],
)
def test_every_gflags_value_syntax_sets_the_flag(args: list[str]) -> None:
    assert parse_argv(args).values == {"eviction_ratio": "0.2"}


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("--enable_ha", "true"),
        ("-enable_ha", "true"),
        ("--noenable_ha", "false"),
        ("-noenable_ha", "false"),
        ("--enable_ha=false", "false"),
        ("--enable_ha=False", "false"),
        ("--enable_ha=0", "false"),
        ("--enable_ha=no", "false"),
        ("--enable_ha=f", "false"),
        ("--enable_ha=true", "true"),
        ("--enable_ha=1", "true"),
        ("--enable_ha=yes", "true"),
        ("--enable_ha=y", "true"),
    ],
)
def test_boolean_flags_take_gflags_forms(arg: str, value: str) -> None:
    assert parse_argv([arg]).values == {"enable_ha": value}


def test_a_boolean_never_takes_the_next_argument() -> None:
    parsed = parse_argv(["--enable_gc", "false", "--rpc_port=1"])
    assert parsed.values == {"enable_gc": "true", "rpc_port": "1"}
    assert parsed.positional == ["false"]


def test_arguments_after_double_dash_go_to_kvpool_master() -> None:
    parsed = parse_argv(["--rpc_port=7", "--", "--eviction-mode", "pool"])
    assert parsed.passthrough == ["--eviction-mode", "pool"]
    assert _argv("--rpc_port=7", "--", "--eviction-mode", "pool")[-2:] == [
        "--eviction-mode",
        "pool",
    ]


def test_a_flagfile_is_read_one_flag_per_line(tmp_path: Path) -> None:
    f = tmp_path / "flags"
    f.write_text("# deployment\n--rpc_port=5000\n\n--noallow_evict_soft_pinned_objects\n")
    parsed = parse_argv([f"--flagfile={f}", "--client_ttl=30"])
    assert parsed.values == {
        "rpc_port": "5000",
        "allow_evict_soft_pinned_objects": "false",
        "client_ttl": "30",
    }


@pytest.mark.parametrize(
    ("arg", "nearest"),
    [
        ("--default_kv_lease_tt=5", "default_kv_lease_ttl"),
        ("--default-kv-lease-ttl=5", "default_kv_lease_ttl"),
        ("--evictoin_ratio=0.1", "eviction_ratio"),
        ("--rpc-port=1", "rpc_port"),
    ],
)
def test_a_misspelt_flag_is_an_error_naming_the_nearest(arg: str, nearest: str) -> None:
    with pytest.raises(InvalidParams, match=f"did you mean --{nearest}\\?"):
        parse_argv([arg])


def test_a_flag_nothing_resembles_is_an_error_without_a_guess() -> None:
    with pytest.raises(InvalidParams, match="unknown command line flag 'zzzz'") as info:
        parse_argv(["--zzzz"])
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rpc_port"], "missing its argument"),
        (["--rpc_port=abc"], "expected an integer"),
        (["--rpc_port=70000"], "out of range"),
        (["--eviction_ratio=x"], "expected a number"),
        (["--enable_ha=maybe"], "expected true or false"),
        (["--default_kv_lease_ttl=5d"], "unknown unit"),
        (["--default_kv_lease_ttl=-1"], "non-negative integer"),
        (["--noeviction_ratio"], "unknown command line flag"),
    ],
)
def test_malformed_values_are_errors_naming_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(InvalidParams, match=message):
        parse_argv(args)


# ------------------------------------------------------------------ units and mapping


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500", 500), ("500ms", 500), ("5s", 5000), ("30m", 1_800_000), ("1H", 3_600_000)],
)
def test_durations_are_milliseconds_unless_suffixed(text: str, ms: int) -> None:
    assert parse_duration_ms(text, name="x") == ms
    assert parse_duration_ms(f" {text} ", name="x") == ms


def test_ttls_keep_mooncakes_units_on_the_kvpool_side() -> None:
    argv = _argv(
        "--default_kv_lease_ttl=500",
        "--default_kv_soft_pin_ttl=5s",
        "--max_kv_soft_pin_ttl=2h",
        "--client_ttl=20",
        "--put_start_discard_timeout_sec=40",
        "--put_start_release_timeout_sec=900",
        "--processing_task_timeout_sec=120",
        "--rpc_conn_timeout_seconds=60",
        "--snapshot_interval_seconds=30",
    )
    assert _opt(argv, "--default-kv-lease-ttl") == "500ms"
    assert _opt(argv, "--default-kv-soft-pin-ttl") == "5000ms"
    assert _opt(argv, "--max-kv-soft-pin-ttl") == "7200000ms"
    assert _opt(argv, "--client-ttl") == "20s"
    assert _opt(argv, "--put-start-discard-timeout") == "40s"
    assert _opt(argv, "--put-start-release-timeout") == "900s"
    assert _opt(argv, "--replica-task-timeout") == "120s"
    assert _opt(argv, "--rpc-idle-timeout") == "60s"
    assert _opt(argv, "--snapshot-interval") == "30s"


def test_the_kvpool_master_accepts_every_translation() -> None:
    """Each mapped option exists in `kvpool master` with the value type given to it."""
    import click

    from kvpool.cli.master import master

    argv = _argv(
        "--rpc_port=5001",
        "--rpc_address=0.0.0.0",
        "--default_kv_lease_ttl=500",
        "--default_kv_soft_pin_ttl=5s",
        "--max_kv_soft_pin_ttl=2h",
        "--noallow_evict_soft_pinned_objects",
        "--eviction_ratio=0.1",
        "--eviction_high_watermark_ratio=0.8",
        "--client_ttl=20",
        "--put_start_discard_timeout_sec=40",
        "--put_start_release_timeout_sec=900",
        "--allocation_strategy=free_ratio_first",
        "--processing_task_timeout_sec=120",
        "--rpc_conn_timeout_seconds=60",
        "--enable_snapshot",
        "--snapshot_backup_dir=/tmp/x",
        "--snapshot_interval_seconds=30",
    )
    ctx = master.make_context("master", argv)
    p = ctx.params
    # No --cluster_id without HA: kvpool master's own default ("kvpool", chosen when unset).
    assert (p["port"], p["host"], p["cluster_id"]) == (5001, "0.0.0.0", None)
    assert p["default_kv_lease_ttl"] == pytest.approx(0.5)
    assert p["default_kv_soft_pin_ttl"] == pytest.approx(5.0)
    assert p["max_kv_soft_pin_ttl"] == pytest.approx(7200.0)
    assert p["allow_evict_soft_pinned_objects"] is False
    assert (p["eviction_ratio"], p["eviction_high_watermark_ratio"]) == (0.1, 0.8)
    assert p["client_ttl"] == 20.0
    assert (p["put_start_discard_timeout"], p["put_start_release_timeout"]) == (40.0, 900.0)
    assert p["allocation_strategy"] == "free_ratio_first"
    assert (p["replica_task_timeout"], p["rpc_idle_timeout"]) == (120.0, 60.0)
    assert (p["data_dir"], p["snapshot_interval"]) == ("/tmp/x", 30.0)
    assert isinstance(master, click.Command)


def test_rpc_port_wins_over_the_deprecated_port() -> None:
    assert _opt(_argv("--port=6000"), "--port") == "6000"
    assert _opt(_argv("--port=6000", "--rpc_port=6001"), "--port") == "6001"
    assert _opt(_argv(), "--port") == "50051"


def test_it_binds_loopback_unless_an_address_is_given() -> None:
    launch = translate({})
    assert "--host" not in launch.argv
    assert any("binding 127.0.0.1" in w for w in launch.warnings)
    assert _opt(_argv("--rpc_address=0.0.0.0"), "--host") == "0.0.0.0"
    launch = translate({"rpc_interface": "lo"}, interface_address=lambda name: "127.0.0.1")
    assert _opt(launch.argv, "--host") == "127.0.0.1"
    assert not launch.warnings


def test_unsupported_features_give_one_warning_each_and_change_nothing() -> None:
    values = parse_argv(
        ["--enable_cxl", "--enable_offload=true", "--metrics_port=9100", "--enable_kv_events"]
    ).values
    launch = translate({**values, "rpc_address": "127.0.0.1"})
    assert len(launch.warnings) == 4
    assert all("is ignored" in w for w in launch.warnings)
    assert [w.split("=")[0] for w in launch.warnings] == [
        "--enable_cxl",
        "--enable_offload",
        "--metrics_port",
        "--enable_kv_events",
    ]
    assert launch.argv == ["--port", "50051", "--host", "127.0.0.1"]


def test_an_unsupported_feature_left_at_its_default_is_silent() -> None:
    launch = translate({"enable_cxl": "false", "rpc_address": "127.0.0.1", "enable_gc": "false"})
    assert launch.warnings == [] and launch.notes == []


def test_unsupported_choices_of_supported_flags_warn_and_fall_back() -> None:
    launch = translate({"allocation_strategy": "cxl", "memory_allocator": "cachelib"})
    assert "--allocation-strategy" not in launch.argv
    assert sum("not supported" in w for w in launch.warnings) == 2
    with pytest.raises(InvalidParams, match="allocation_strategy=best"):
        translate({"allocation_strategy": "best"})


def test_ha_flags_build_kvpools_etcd_url() -> None:
    launch = translate({"enable_ha": "true", "etcd_endpoints": "10.0.0.1:2379;10.0.0.2:2379"})
    assert launch.ha_url == "etcd://10.0.0.1:2379,10.0.0.2:2379/mooncake_cluster"
    launch = translate(
        {
            "enable_ha": "true",
            "ha_backend_connstring": "http://e1:2379,http://e2:2379",
            "etcd_endpoints": "ignored:1",
            "cluster_id": "prod",
        }
    )
    assert launch.ha_url == "etcd://e1:2379,e2:2379/prod"
    assert _opt(launch.argv, "--cluster-id") == "prod"
    assert translate({"etcd_endpoints": "e1:2379"}).ha_url is None


def test_the_cluster_id_names_the_pool_only_with_ha() -> None:
    """Mooncake's clients send no cluster id; kvpool's handshake checks one. Without HA the
    pool keeps kvpool's id, which compat stores send."""
    launch = translate({"cluster_id": "prod", "rpc_address": "127.0.0.1"})
    assert "--cluster-id" not in launch.argv
    assert any("only with --enable_ha" in n for n in launch.notes)
    launch = translate({"enable_ha": "true", "etcd_endpoints": "e:1"})
    assert _opt(launch.argv, "--cluster-id") == "mooncake_cluster"


def test_ha_without_endpoints_or_with_another_backend_is_refused() -> None:
    with pytest.raises(InvalidParams, match="needs --ha_backend_connstring"):
        translate({"enable_ha": "true"})
    with pytest.raises(InvalidParams, match="etcd only"):
        translate({"enable_ha": "true", "ha_backend_type": "redis", "etcd_endpoints": "e:1"})


def test_ha_becomes_the_masters_ha_option_and_kvpool_master_parses_it() -> None:
    from kvpool.cli.master import master

    args = _argv("--enable_ha", "--etcd_endpoints=e1:2379", "--rpc_port=5001")
    assert _opt(args, "--ha") == "etcd://e1:2379/mooncake_cluster"
    p = master.make_context("master", list(args)).params
    assert p["ha_url"] == "etcd://e1:2379/mooncake_cluster"


def test_mooncakes_etcd_endpoint_lists_become_one_url() -> None:
    assert mooncake_etcd_url("h1:2379; h2:2379;", "c") == "etcd://h1:2379,h2:2379/c"
    assert mooncake_etcd_url("etcd://h1:2379", "c") == "etcd://h1:2379/c"
    with pytest.raises(InvalidParams):
        mooncake_etcd_url(" ; ", "c")


def test_snapshots_need_a_directory_and_map_to_the_data_dir() -> None:
    with pytest.raises(InvalidParams, match="snapshot_backup_dir"):
        translate({"enable_snapshot": "true"})
    launch = translate({"enable_snapshot": "true"}, env={"MOONCAKE_SNAPSHOT_LOCAL_PATH": "/s"})
    assert _opt(launch.argv, "--data-dir") == "/s"
    launch = translate({"enable_snapshot_restore": "true", "snapshot_backup_dir": "/b"})
    assert _opt(launch.argv, "--data-dir") == "/b"
    launch = translate(
        {"enable_snapshot": "true", "snapshot_backup_dir": "/b", "snapshot_object_store_type": "s3"}
    )
    assert any("'s3' is not supported" in w for w in launch.warnings)


def test_the_config_file_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    conf = tmp_path / "master.json"
    conf.write_text(json.dumps({"rpc_port": 5100, "client_ttl": 30, "enable_ha": False}))
    assert load_config_file(str(conf)) == {
        "rpc_port": "5100",
        "client_ttl": "30",
        "enable_ha": "false",
    }
    argv = _argv(f"--config_path={conf}", "--client_ttl=40")
    assert _opt(argv, "--port") == "5100"
    assert _opt(argv, "--client-ttl") == "40s"
    conf.write_text(json.dumps({"client_tll": 3}))
    with pytest.raises(InvalidParams, match="did you mean --client_ttl"):
        load_config_file(str(conf))


def test_every_flag_of_the_table_is_accepted() -> None:
    for flag in FLAGS:
        value = "true" if flag.type == "bool" else flag.default
        assert parse_argv([f"--{flag.name}={value}"]).values[flag.name] in (value, "true")


def test_docs_carry_the_generated_flag_table() -> None:
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(
        r"<!-- mooncake_master flags: begin.*?-->\n(.*?)<!-- mooncake_master flags: end -->",
        text,
        re.DOTALL,
    )
    assert m is not None, "docs/compat.md lacks the mooncake_master flag table markers"
    assert m.group(1) == flag_table_markdown(), (
        "docs/compat.md's flag table is stale: run "
        "`python -m kvpool.compat.mooncake_flags --write-docs docs/compat.md`"
    )
    assert sum(f.support is Support.UNSUPPORTED for f in FLAGS) > 30


# ------------------------------------------------------------------ real processes


def _mooncake_master(*args: str) -> Proc:
    return Proc([sys.executable, "-m", "kvpool.cli.mooncake_master", *args], name="mooncake_master")


def test_a_deployment_command_line_serves_the_compat_api() -> None:
    from kvpool.compat.mooncake import MooncakeDistributedStore

    port = free_port()
    with _mooncake_master(
        f"--rpc_port={port}",
        "--default_kv_lease_ttl=500",
        "--eviction_high_watermark_ratio=0.9",
        "--enable_gc=false",
        "--enable_cxl",
        "-v=1",
    ) as master:
        assert master.wait_ready() == f"127.0.0.1:{port}"
        out = "\n".join(master.lines)
        assert "binding 127.0.0.1" in out
        assert out.count("--enable_cxl=true is ignored") == 1
        store = MooncakeDistributedStore()
        rc = store.setup(
            "127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", f"127.0.0.1:{port}"
        )
        assert rc == 0
        try:
            assert store.put("k", b"value") == 0
            assert store.get("k") == b"value"
            # The read granted a 500 ms lease (not 500 s): remove is refused, then allowed.
            started = time.monotonic()
            assert store.remove("k") == -706
            wait_until(lambda: store.remove("k") == 0, timeout=5.0, what="the lease to end")
            assert time.monotonic() - started < 5.0
        finally:
            store.close()
        assert master.stop() == 0


def test_a_bad_flag_exits_2_naming_the_nearest() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvpool.cli.mooncake_master", "--rpc_prot=5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "did you mean --rpc_port?" in done.stderr


def test_the_http_metadata_server_is_a_no_op_that_says_why() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvpool.compat.mooncake_metadata", "--port", "8080", "--exit"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "kvpool needs no HTTP metadata server" in done.stderr
    with Proc(
        [sys.executable, "-m", "kvpool.compat.mooncake_metadata", "--port", str(free_port())],
        name="metadata",
    ) as proc:
        proc.wait_for_line("needs no HTTP metadata server")
        assert proc.alive()
        assert proc.stop() == 0  # SIGTERM: a clean exit


def test_help_and_version_exit_0() -> None:
    for flag, expect in (("--help", "--default_kv_lease_ttl"), ("-version", "kvpool")):
        done = subprocess.run(
            [sys.executable, "-m", "kvpool.cli.mooncake_master", flag],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and expect in done.stdout, done.stderr


def test_mooncake_ha_masters_and_an_etcd_master_address_survive_a_leader_kill(
    tmp_path: Path,
) -> None:
    """Mooncake's HA deployment, unchanged: two `mooncake_master --enable_ha` on one etcd, a
    compat store given `etcd://HOST:PORT` (Mooncake's form: no cluster id, taken from
    MC_STORE_CLUSTER_ID or Mooncake's default); the leader is SIGKILLed and the store goes on
    with every key it wrote."""
    from kvpool.compat.mooncake import MooncakeDistributedStore
    from kvtest.etcd import EtcdServer

    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    ports = [free_port(), free_port()]
    masters = [
        _mooncake_master(
            f"--rpc_port={port}",
            "--enable_ha",
            f"--etcd_endpoints={etcd.endpoint}",
            "--",
            "--advertise",
            f"127.0.0.1:{port}",
            "--member-id",
            f"m{i}",
        )
        for i, port in enumerate(ports)
    ]
    store = MooncakeDistributedStore()
    try:
        for m in masters:
            m.wait_ready()
        rc = store.setup(
            "127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", f"etcd://{etcd.endpoint}"
        )
        assert rc == 0
        values = {f"k{i}": f"value {i}".encode() * 50 for i in range(50)}
        for k, v in values.items():
            assert store.put(k, v) == 0
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvpool",
                "status",
                "--master",
                f"etcd://{etcd.endpoint}/mooncake_cluster",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        leader = 0 if "role leader (m0)" in status else 1
        assert f"role leader (m{leader})" in status
        masters[leader].kill9()
        # The store finds the standby through etcd, remounts, and carries on.
        for k, v in values.items():
            assert store.get(k) == v, k
        assert store.put("after", b"after the failover") == 0
        assert store.get("after") == b"after the failover"
    finally:
        store.close()
        for m in masters:
            m.stop()
        etcd.stop()
