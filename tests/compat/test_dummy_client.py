"""`setup_dummy` and the standalone client (`mooncake_client` on kvpool), with real processes.

A kvpool master and one standalone client contributing the host's memory; dummy clients in
this process and in child processes attach to it, see each other's keys, use the zero-copy and
ranged calls on `alloc_from_mem_pool` memory, survive a restart of the standalone client, and
one killed with SIGKILL mid-put leaves no half-written object and is seen to go.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kvtest.procs import Proc, free_port, kvpool_proc

SEGMENT = "32MB"


def _standalone(master: str, port: int) -> Proc:
    proc = Proc(
        [
            sys.executable,
            "-m",
            "kvpool.compat.mooncake_client",
            f"--master_server_address={master}",
            f"--port={port}",
            f"--global_segment_size={SEGMENT}",
        ],
        name="mooncake_client",
    )
    proc.wait_for_line(r"mooncake_client listening on", timeout=30)
    return proc


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[str, str, Proc]]:
    """(master address, standalone client address, its process)."""
    with kvpool_proc("master", "--port", "0") as master:
        address = master.wait_ready()
        port = free_port()
        client = _standalone(address, port)
        try:
            yield address, f"127.0.0.1:{port}", client
        finally:
            client.stop()


def _dummy(server: str, pool_size: int = 4 << 20) -> Any:
    from kvpool.compat.mooncake import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    assert store.setup_dummy(pool_size, 4 << 20, server) == 0
    return store


CHILD = """
import sys
from kvpool.compat.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup_dummy(1 << 20, 1 << 20, sys.argv[1]) == 0
assert s.get("from-parent") == b"parent's value", s.get("from-parent")
assert s.put("from-child", b"child's value") == 0
assert s.close() == 0
print("child ok")
"""


def test_two_processes_attached_to_one_standalone_client_see_each_others_keys(
    pool: tuple[str, str, Proc],
) -> None:
    _, server, client = pool
    store = _dummy(server)
    try:
        assert store.put("from-parent", b"parent's value") == 0
        done = subprocess.run(
            [sys.executable, "-c", CHILD, server],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout.strip() == "child ok", done.stderr[-2000:]
        assert store.get("from-child") == b"child's value"
        # The dummy contributes no memory: the object lives in the standalone client's segment.
        (replica,) = store.get_replica_desc("from-child")
        endpoint = replica.get_memory_descriptor().buffer_descriptor.transport_endpoint
        assert endpoint != store.get_hostname()
        client.wait_for_line(r"dummy client pid \d+ attached")
    finally:
        store.close()


def test_zero_copy_and_ranged_calls_on_pool_memory(pool: tuple[str, str, Proc]) -> None:
    _, server, _ = pool
    store = _dummy(server, pool_size=64 << 10)
    try:
        src = store.alloc_from_mem_pool(16 << 10)
        dst = store.alloc_from_mem_pool(16 << 10)
        assert src and dst
        assert store.alloc_from_mem_pool(64 << 10) == 0  # past mem_pool_size
        payload = bytes(range(256)) * 64
        ctypes.memmove(src, payload, len(payload))
        assert store.put_from("zc", src, len(payload)) == 0
        assert store.get_into("zc", dst, 16 << 10) == len(payload)
        assert ctypes.string_at(dst, len(payload)) == payload
        got = store.get_into_ranges([dst], [["zc"]], [[[0, 100]]], [[[10, 300]]], [[[50, 20]]])
        assert got == [[[50, 20]]]
        assert ctypes.string_at(dst, 50) == payload[10:60]
        assert ctypes.string_at(dst + 100, 20) == payload[300:320]
        assert store.batch_put_from(["zc2"], [src], [1024]) == [0]
        assert store.batch_get_into(["zc2"], [dst], [1024]) == [1024]
    finally:
        store.close()


def test_setup_dummy_without_a_standalone_client_answers_minus_one() -> None:
    from kvpool.compat.mooncake import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    assert store.setup_dummy(1 << 20, 1 << 20, f"127.0.0.1:{free_port()}") == -1
    assert store.health_check() == 1
    with pytest.raises(TypeError):
        store.setup_dummy(1 << 20, 1 << 20, 50052)


KILLED = """
import sys
from kvpool.compat.mooncake import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup_dummy(1 << 20, 8 << 20, sys.argv[1]) == 0
value = bytes(range(256)) * 4096  # 1 MiB
i = 0
while True:
    s.remove(f"kill-{i - 8}", True)  # keep well inside the segment
    assert s.put(f"kill-{i}", value) == 0
    if i == 3:
        print("putting", flush=True)
    i += 1
"""


def test_a_dummy_killed_mid_put_leaves_no_partial_object(pool: tuple[str, str, Proc]) -> None:
    _, server, client = pool
    with Proc([sys.executable, "-c", KILLED, server], name="doomed") as doomed:
        doomed.wait_for_line("putting", timeout=30)
        pid = doomed.pid
        doomed.kill9()
        client.wait_for_line(rf"dummy client pid {pid} detached", timeout=15)
    store = _dummy(server)
    try:
        value = bytes(range(256)) * 4096
        for i in range(64):
            got = store.get(f"kill-{i}")
            assert got in (b"", value), f"kill-{i}: {len(got)} bytes"
        assert store.put("after-kill", value) == 0
        assert store.get("after-kill") == value
    finally:
        store.close()


def test_a_dummy_survives_a_restart_of_the_standalone_client() -> None:
    with kvpool_proc("master", "--port", "0") as master:
        address = master.wait_ready()
        port = free_port()
        first = _standalone(address, port)
        store = _dummy(f"127.0.0.1:{port}")
        try:
            assert store.put("before", b"1") == 0
            first.stop()
            second = _standalone(address, port)
            try:
                # The dummy re-attaches by itself; its data path never went through the
                # standalone client, so calls keep their answers.
                second.wait_for_line(r"dummy client pid \d+ attached", timeout=15)
                assert store.put("after", b"2") == 0
                assert store.get("after") == b"2"
                assert store.health_check() == 0
            finally:
                store.close()
                second.wait_for_line(r"detached \(0 attached\)", timeout=15)
                second.stop()
        finally:
            store.close()


def test_kvpool_client_is_the_standalone_client_with_kvpools_flags() -> None:
    with kvpool_proc("master", "--port", "0") as master:
        address = master.wait_ready()
        port = free_port()
        with kvpool_proc(
            "client", "--master", address, "--port", str(port), "--segment-size", "16MiB"
        ) as standalone:
            standalone.wait_for_line(r"kvpool client listening on 127.0.0.1:\d+", timeout=30)
            store = _dummy(f"127.0.0.1:{port}")
            try:
                assert store.put("via-kvpool-client", b"v") == 0
                assert store.get("via-kvpool-client") == b"v"
            finally:
                store.close()
            assert standalone.stop() == 0
