"""Mooncake's `--root_fs_dir` (the DFS root of `mooncake_master`) is kvpool's `--dfs-root`."""

from __future__ import annotations

from kvpool.compat.mooncake_flags import BY_NAME, Support, parse_argv, translate


def test_root_fs_dir_maps_to_dfs_root() -> None:
    assert BY_NAME["root_fs_dir"].support is Support.MAPPED
    launch = translate(parse_argv(["--root_fs_dir=/mnt/3fs/kv"]).values)
    i = launch.argv.index("--dfs-root")
    assert launch.argv[i + 1] == "/mnt/3fs/kv"
    assert not any("root_fs_dir" in w for w in launch.warnings)
    assert "--dfs-root" not in translate({}).argv  # Mooncake's default: no DFS tier
