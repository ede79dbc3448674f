"""`kvpool node`, `kvpool up` and `kvpool demo` as a user runs them: real processes, real
signals, and nothing left behind afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from kvpool.client import ReplicateConfig, Store
from kvpool.protocol.messages import Response, Stats, StatsReply, TaskStatus
from kvpool.rpc.client import RpcClient
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.procs import kvpool_proc, kvpool_up, run_kvpool, wait_until


def stats(address: str) -> StatsReply:
    with RpcClient(address, response_type=Response) as rpc:
        return rpc.call_as(Stats(), StatsReply)


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_node_mounts_serves_and_unmounts_cleanly_on_sigterm(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0)
    node = kvpool_proc("node", "--master", p.address, "--segment-size", "32MiB", name="node")
    try:
        endpoint = node.wait_ready(timeout=60)
        assert any("pre-fault" in line for line in node.lines)  # the progress bar
        seg = endpoint + "/0"
        assert [s.name for s in stats(p.address).segments] == [seg]
        with Store(p.address) as s:
            s.put("k", b"v" * 1000)
            assert s.get("k") == b"v" * 1000
        fds = os.listdir(f"/proc/{node.pid}/fd")
        links = [os.readlink(f"/proc/{node.pid}/fd/{f}") for f in fds]
        assert any(f"memfd:kvpool:{seg}" in link for link in links)
        assert node.stop() == 0
        assert any("unmounting" in line for line in node.lines)
        assert stats(p.address).segments == []  # unmounted at once, not after client_ttl
    finally:
        node.stop()


def test_node_refuses_a_bad_size_and_an_unreachable_master(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=0)
    bad = run_kvpool("node", "--master", p.address, "--segment-size", "lots", timeout=30)
    assert bad.returncode != 0 and "segment-size" in bad.stderr
    nowhere = run_kvpool("node", "--master", "127.0.0.1:1", "--segment-size", "1MiB")
    assert nowhere.returncode != 0 and "cannot join" in nowhere.stderr


def test_up_serves_a_pool_and_ctrl_c_leaves_nothing_behind() -> None:
    up = kvpool_up("--refresh", "0.1s", segment_size="64MiB")
    try:
        address = up.wait_ready(timeout=60)
        children = [c.pid for c in psutil.Process(up.pid).children(recursive=True)]
        assert len(children) == 2  # the master and the node
        with Store(address) as s:
            s.put("k", b"hello")
            assert s.get("k") == b"hello"
        up.wait_for_line(r", 1 objects .* 1 segment\(s\)", timeout=20)  # the live status line
        os.kill(up.pid, signal.SIGINT)
        assert up.popen.wait(timeout=30) == 0
        wait_until(lambda: gone(children), timeout=10, what="the master and node to exit")
    finally:
        up.stop()


def test_demo_runs_end_to_end_and_reports_no_checksum_failures() -> None:
    args = [sys.executable, "-m", "kvpool", "demo", "--synthetic", "--segment-size", "64MiB"]
    args += ["--layers", "4", "--prompts", "2", "--prompt-chunks", "2", "--new-prompts", "1"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checksum failures: 0; byte mismatches: 0" in out.stdout
    assert "demo: ok" in out.stdout
    assert "decode hit ratio" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("embedded pool pids:"))
    pids = [int(x) for x in line.split(":")[1].split()]
    assert len(pids) == 2
    wait_until(lambda: gone(pids), timeout=10, what="the demo's master and node to be gone")


def test_up_stops_everything_and_fails_when_its_node_dies() -> None:
    up = kvpool_up("--refresh", "0.1s")
    try:
        up.wait_ready(timeout=60)
        children = psutil.Process(up.pid).children(recursive=True)
        node = next(c for c in children if "node" in c.cmdline())
        node.kill()
        assert up.popen.wait(timeout=30) != 0
        assert any("exited" in line for line in up.lines)
        wait_until(lambda: gone([c.pid for c in children]), timeout=10, what="the master to exit")
    finally:
        up.stop()


BAD_POLL = ("--task-poll-interval", "soon")


def test_node_executes_replica_tasks_as_soon_as_a_ping_announces_them(
    pool: PoolFactory,  # noqa: F811
) -> None:
    # The poll is a minute: only the heartbeat's pending_tasks can make the task run in time.
    p = pool(nodes=1, segment_size="16MiB")
    node = kvpool_proc(
        "node",
        "--master",
        p.address,
        "--segment-size",
        "8MiB",
        "--no-progress",
        "--heartbeat-interval",
        "100ms",
        "--task-poll-interval",
        "60s",
        name="slow-poll node",
    )
    try:
        source = node.wait_ready(timeout=60) + "/0"
        target = p.node_endpoints[0] + "/0"
        with Store(p.address) as s:
            s.put("t", b"t" * 5000, ReplicateConfig(preferred_segments=[source]))
            task = s.create_move_task("t", source, target)
            info = wait_until(lambda: (i := s.query_task(task)).done and i, timeout=20)
            assert info.status == TaskStatus.SUCCESS, info.message
            assert [r.segment for r in s.get_replica_desc("t")] == [target]
            assert s.get("t") == b"t" * 5000
        bad = run_kvpool("node", "--master", p.address, *BAD_POLL, timeout=30)
        assert bad.returncode != 0 and "task-poll-interval" in bad.stderr
    finally:
        node.stop()
