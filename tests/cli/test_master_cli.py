"""`kvpool master` and `kvpool status` as a user runs them: real child processes, loopback."""

from __future__ import annotations

import functools
import json
import signal

import pytest

from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient
from kvtest.procs import kvpool_proc, run_kvpool

MASTER_FLAGS = [
    "--host",
    "--port",
    "--cluster-id",
    "--default-kv-lease-ttl",
    "--default-kv-soft-pin-ttl",
    "--max-kv-soft-pin-ttl",
    "--allow-evict-soft-pinned-objects",
    "--eviction-high-watermark-ratio",
    "--eviction-ratio",
    "--eviction-mode",
    "--client-ttl",
    "--put-start-discard-timeout",
    "--put-start-release-timeout",
    "--replica-task-timeout",
    "--allocation-strategy",
    "--num-shards",
]


kvpool = functools.partial(run_kvpool, timeout=30)


def test_master_help_documents_every_mooncake_named_flag() -> None:
    out = kvpool("master", "--help")
    assert out.returncode == 0
    for flag in MASTER_FLAGS:
        assert flag in out.stdout, flag


@pytest.mark.parametrize(
    "args, message",
    [
        (["--client-ttl", "soon"], "--client-ttl"),
        (["--eviction-ratio", "2"], "--eviction-ratio"),
        (["--allocation-strategy", "nearest"], "--allocation-strategy"),
        (["--put-start-release-timeout", "1s"], "put_start_release_timeout"),
        (["--alignment", "48"], "alignment"),
        (["--replica-task-timeout", "0s"], "replica_task_timeout"),
    ],
)
def test_master_refuses_bad_flags_with_a_message_naming_them(args: list[str], message: str) -> None:
    out = kvpool("master", "--port", "0", *args)
    assert out.returncode == 2
    assert message in out.stderr


def test_master_binds_loopback_by_default_and_applies_its_flags() -> None:
    proc = kvpool_proc(
        "master", "--port", "0", "--default-kv-lease-ttl", "2500ms", "--cluster-id", "c9"
    )
    with proc:
        address = proc.wait_ready()
        assert address.startswith("127.0.0.1:")
        assert any(line.startswith("kvpool master listening on 127.0.0.1:") for line in proc.lines)
        with RpcClient(address, response_type=m.Response, cluster_id="c9") as rpc:
            rpc.call(
                m.MountSegment(
                    m.ClientId("n"), m.HostId("h"), m.SegmentInfo(m.SegmentName("s"), 1 << 20)
                )
            )
            rpc.call(m.PutStart(m.ClientId("w"), "k", 10))
            rpc.call(m.PutEnd(m.ClientId("w"), "k"))
            assert rpc.call(m.GetReplicaList("k")).lease_ttl_ms == 2500


def test_master_exits_zero_on_sigint() -> None:
    proc = kvpool_proc("master", "--port", "0")
    with proc:
        proc.wait_ready()
        proc.popen.send_signal(signal.SIGINT)
        assert proc.popen.wait(timeout=10) == 0


def test_master_on_a_taken_port_fails_with_a_message() -> None:
    first = kvpool_proc("master", "--port", "0")
    with first:
        port = first.wait_ready().rsplit(":", 1)[1]
        out = kvpool("master", "--port", port)
        assert out.returncode == 1 and "cannot listen" in out.stderr


def test_status_prints_segments_and_clients_as_tables_and_json() -> None:
    proc = kvpool_proc("master", "--port", "0")
    with proc:
        address = proc.wait_ready()
        with RpcClient(address, response_type=m.Response) as rpc:
            info = m.SegmentInfo(m.SegmentName("seg-a"), 1 << 30, m.HostId("h1"), "127.0.0.1:7")
            rpc.call(m.MountSegment(m.ClientId("node-a"), m.HostId("h1"), info))
            keys = [f"k{i}" for i in range(10)]
            rpc.call(m.BatchPutStart(m.ClientId("w"), keys, [1 << 20] * 10))
            rpc.call(m.BatchPutEnd(m.ClientId("w"), keys))
            arena = rpc.call(m.ReserveArena(m.ClientId("w"), 4 << 20))
            assert arena.code == 0
        out = kvpool("status", "--master", address)
        assert out.returncode == 0, out.stderr
        assert "10 objects" in out.stdout and "0 replica tasks running" in out.stdout
        assert "1 arenas hold 4.0 MiB of it for puts" in out.stdout
        seg_line = next(line for line in out.stdout.splitlines() if line.startswith("seg-a"))
        assert "node-a" in seg_line and "14.0 MiB" in seg_line and seg_line.split()[-1] == "10"
        assert any(line.startswith("node-a") for line in out.stdout.splitlines())
        out = kvpool("status", "--master", address, "--json")
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["objects"] == 10 and data["tasks_active"] == 0
        assert data["arenas"] == 1 and data["arena_bytes"] == 4 << 20
        assert data["segments"][0]["name"] == "seg-a"
        assert data["segments"][0]["used"] == 14 << 20  # 10 objects + the arena
        assert data["clients"][0]["client_id"] == "node-a"


def test_status_of_an_unreachable_master_fails_with_a_message() -> None:
    out = kvpool("status", "--master", "127.0.0.1:1", "--timeout", "1")
    assert out.returncode == 1 and "cannot get the status" in out.stderr


@pytest.mark.parametrize("reclaim", [True, False])
def test_a_full_pool_evicts_unleased_objects_unless_no_reclaim(reclaim: bool) -> None:
    flag = "--reclaim" if reclaim else "--no-reclaim"
    proc = kvpool_proc("master", "--port", "0", flag)
    with proc:
        address = proc.wait_ready()
        with RpcClient(address, response_type=m.Response) as rpc:
            info = m.SegmentInfo(m.SegmentName("s"), 8 << 20, m.HostId("h"), "127.0.0.1:7")
            rpc.call(m.MountSegment(m.ClientId("node"), m.HostId("h"), info))
            codes = []
            for i in range(16):  # twice what fits
                started = rpc.call(m.PutStart(m.ClientId("w"), f"k{i}", 1 << 20))
                codes.append(started.code)
                if started.code == 0:
                    rpc.call(m.PutEnd(m.ClientId("w"), f"k{i}"))
            if reclaim:
                assert codes == [0] * 16
                batch = rpc.call(m.BatchGetReplicaList([f"k{i}" for i in range(16)]))
                readable = [r.code for r in batch.results].count(0)
                # Room was made by evicting: which objects went is reclaim's policy (and its
                # background kswapd keeps the pool under the high watermark meanwhile).
                assert 1 <= readable <= 8
            else:
                assert codes == [0] * 8 + [-200] * 8
                assert rpc.call(m.GetReplicaList("k0")).code == 0
