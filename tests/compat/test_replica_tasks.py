"""Replica copy and move tasks between two stores, and init_all / setup_dummy.

Two stores of one process each contribute a segment; a task copies or moves an object's replica
from one to the other, carried out by the store owning the source (Mooncake: the client polling
FetchTasks; kvpool: the store's TaskExecutor). The replica descriptors show where the bytes are
before and after, and reads through either store must give the value back.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from kvtest.procs import Proc, kvpool_proc, wait_until


def _endpoints(store: Any, key: str) -> list[str]:
    return sorted(
        d.get_memory_descriptor().buffer_descriptor.transport_endpoint
        for d in store.get_replica_desc(key)
    )


def _finished(backend: Any, store: Any, task_id: tuple[int, int]) -> Any:
    """The task's QueryTaskResponse once it is SUCCESS or FAILED."""
    status = backend.module.TaskStatus
    answers: list[Any] = []

    def done() -> bool:
        response, code = store.query_task(task_id)
        assert code == 0, f"query_task answered {code}"
        answers.append(response)
        return response.status in (status.SUCCESS, status.FAILED)

    wait_until(done, timeout=15, what="the task to finish")
    return answers[-1]


def _two_stores(backend: Any, key: str, value: bytes) -> tuple[Any, str, str]:
    """Two stores, `key` put through the first; (first store, source, other store's name)."""
    first, second = backend.store(), backend.store()
    assert first.put(key, value) == 0
    [source] = _endpoints(first, key)
    names = {first.get_hostname(), second.get_hostname()}
    assert source in names
    [other] = names - {source}
    return first, source, other


def test_copy_task_adds_a_replica_on_the_target_store(backend: Any) -> None:
    value = b"copied bytes " * 300
    store, source, target = _two_stores(backend, "copy-me", value)
    task_id, code = store.create_copy_task("copy-me", [target])
    assert code == 0 and task_id != (0, 0)
    assert isinstance(task_id, tuple) and all(isinstance(x, int) for x in task_id)
    response = _finished(backend, store, task_id)
    assert response.status == backend.module.TaskStatus.SUCCESS, response
    assert response.type == backend.module.TaskType.REPLICA_COPY
    assert response.id == task_id
    assert response.assigned_client != (0, 0)
    assert 0 < response.created_at_ms_epoch <= response.last_updated_at_ms_epoch
    assert _endpoints(store, "copy-me") == sorted([source, target])
    for desc in store.get_replica_desc("copy-me"):
        assert desc.status == backend.module.ReplicaStatus.COMPLETE
        assert desc.get_memory_descriptor().buffer_descriptor.size == len(value)
    assert store.get("copy-me") == value
    # A second copy to a store that already holds a replica: Mooncake creates a task that
    # succeeds without adding one; kvpool refuses it at once (docs/compat.md, on purpose).
    again_id, again = store.create_copy_task("copy-me", [target])
    if backend.name == "kvpool":
        assert (again_id, again) == ((0, 0), -711)  # REPLICA_ALREADY_EXISTS
    else:
        assert again == 0
        assert _finished(backend, store, again_id).status == backend.module.TaskStatus.SUCCESS
    assert _endpoints(store, "copy-me") == sorted([source, target])


def test_move_task_leaves_one_replica_on_the_target_store(backend: Any) -> None:
    value = b"moved bytes " * 500
    store, source, target = _two_stores(backend, "move-me", value)
    task_id, code = store.create_move_task("move-me", source, target)
    assert code == 0
    response = _finished(backend, store, task_id)
    assert response.status == backend.module.TaskStatus.SUCCESS, response
    assert response.type == backend.module.TaskType.REPLICA_MOVE
    assert _endpoints(store, "move-me") == [target]
    assert store.get("move-me") == value
    # Source and target the same store: refused before anything is created.
    assert store.create_move_task("move-me", target, target) == ((0, 0), -600)


def test_batch_replica_clear_by_segment_clears_only_that_segment(backend: Any) -> None:
    store, source, other = _two_stores(backend, "clear-me", b"x" * 100)
    assert store.batch_replica_clear(["clear-me"], other) == []
    assert store.batch_is_exist(["clear-me"]) == [1]
    wait_until(
        lambda: store.batch_replica_clear(["clear-me"], source) == ["clear-me"],
        timeout=10,
        what="the exist check's lease to end and the replica to be cleared",
    )
    assert store.get("clear-me") == b""


def test_batch_replica_clear_leaves_other_stores_objects(backend: Any) -> None:
    first, second = backend.store(), backend.store()
    assert second.put("theirs", b"3") == 0
    assert first.batch_replica_clear(["theirs"]) == []
    assert second.batch_is_exist(["theirs"]) == [1]


def test_setup_dummy_needs_a_mooncake_client_process(backend: Any) -> None:
    """Both answer -1 when what serves the address is not a standalone client (here: the
    master itself); tests/compat/test_dummy_client.py attaches to a real one."""
    store = backend.new()
    assert store.setup_dummy(1 << 20, 1 << 20, backend.master) == -1
    assert store.health_check() == 1


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_init_all_joins_the_master_on_mooncakes_default_address(backend: Any) -> None:
    """init_all(protocol, device, size) is setup() with Mooncake's legacy defaults: hostname
    "localhost:12345", master 127.0.0.1:50051, a 1 GiB local buffer."""
    if backend.name != "kvpool":
        pytest.skip("the wheel's init_all needs etcd on 127.0.0.1:2379 (it crashes without)")
    if not _port_free(50051):
        pytest.skip("127.0.0.1:50051 is in use here; init_all's master address is fixed")
    store = backend.new()
    assert store.init_all("tcp", "", 1 << 20) == -1  # nothing listens on 50051: at once
    master: Proc = kvpool_proc("master", "--host", "127.0.0.1", "--port", "50051")
    try:
        master.wait_ready(timeout=30)
        assert store.init_all("tcp", "", 1 << 20) == 0
        assert store.get_hostname() == "localhost:12345"
        assert store.put("legacy", b"init_all") == 0
        assert store.get("legacy") == b"init_all"
        assert store.init_all("tcp", "", 1 << 20) == -600  # already set up
        assert store.close() == 0
    finally:
        master.stop()
