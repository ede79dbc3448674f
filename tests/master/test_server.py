"""The master over real RPC: a `kvpool master` child process on an ephemeral loopback port
(and, where time must be driven by hand, a `MasterServer` on its own loop in a thread with an
injected clock). Clients are the real `RpcClient`."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from kvpool.errors import ErrorCode
from kvpool.master.config import MasterConfig
from kvpool.master.server import MasterServer
from kvpool.protocol import messages as m
from kvpool.rpc import RpcClient, ServerThread
from kvtest.procs import free_port, kvpool_proc, wait_until

E = ErrorCode
MiB = 1 << 20
HOST = m.HostId("host-a")


def client(address: str, timeout: float = 10.0) -> RpcClient:
    return RpcClient(address, response_type=m.Response, timeout=timeout)


def seg(name: str, size: int = 64 * MiB) -> m.SegmentInfo:
    return m.SegmentInfo(m.SegmentName(name), size, HOST, "127.0.0.1:1", "")


@pytest.fixture(scope="module")
def master() -> Iterator[str]:
    proc = kvpool_proc(
        "master",
        "--port",
        "0",
        "--client-ttl",
        "1s",
        "--client-dead-ttl",
        "1s",  # silent and dropped at once: these tests are about the drop path
        name="kvpool master",
    )
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


@pytest.fixture
def rpc(master: str) -> Iterator[RpcClient]:
    with client(master) as c:
        yield c


def _uid(prefix: str) -> str:
    import uuid

    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_master_answers_echo_on_its_ephemeral_loopback_port(master: str, rpc: RpcClient) -> None:
    assert master.startswith("127.0.0.1:") and not master.endswith(":50051")
    assert rpc.call(m.Echo(b"ping")) == m.EchoReply(b"ping")


def test_a_client_on_the_masters_host_talks_over_its_unix_socket(rpc: RpcClient) -> None:
    assert rpc.call(m.Echo(b"ping")) == m.EchoReply(b"ping")
    assert rpc.transport == "unix"


def test_kvpool_master_no_unix_socket_keeps_clients_on_tcp() -> None:
    proc = kvpool_proc("master", "--port", "0", "--no-unix-socket", name="master-tcp-only")
    with proc:
        address = proc.wait_ready()
        with client(address) as c:
            assert c.call(m.Echo(b"tcp")) == m.EchoReply(b"tcp")
            assert c.transport == "tcp"
        proc.popen.send_signal(signal.SIGTERM)
        assert proc.popen.wait(timeout=10) == 0, proc.output()


@pytest.mark.parametrize(("unix_socket", "transport"), [(True, "unix"), (False, "tcp")])
def test_master_config_unix_socket_reaches_the_rpc_server(
    unix_socket: bool, transport: str
) -> None:
    server = MasterServer(MasterConfig(port=0, unix_socket=unix_socket), server_name="t")
    with ServerThread(server, name="master-unix") as thread:  # type: ignore[arg-type]
        assert bool(server.rpc.unix_address) is unix_socket
        with client(thread.endpoint) as c:
            assert c.call(m.Echo(b"x")) == m.EchoReply(b"x")
            assert c.transport == transport


def test_put_get_remove_lifecycle_over_rpc(rpc: RpcClient) -> None:
    node, writer = m.ClientId(_uid("node")), m.ClientId(_uid("writer"))
    name = _uid("seg")
    assert rpc.call(m.MountSegment(node, HOST, seg(name))) == m.Reply(0)
    assert rpc.call(m.ReMountSegment(writer, HOST, [])) == m.Reply(0)
    key = _uid("key")
    started = rpc.call(
        m.PutStart(writer, key, 1000, m.ReplicateConfigMsg(preferred_segments=[name]))
    )
    assert started.code == 0 and started.replicas[0].segment == name
    assert rpc.call(m.GetReplicaList(key)).code == E.REPLICA_IS_NOT_READY
    assert rpc.call(m.PutEnd(writer, key, 42)) == m.Reply(0)
    got = rpc.call(m.GetReplicaList(key))
    assert (got.code, got.size, got.checksum, got.lease_ttl_ms) == (0, 1000, 42, 10_000)
    assert got.replicas[0].offset == started.replicas[0].offset
    assert rpc.call(m.ExistKey(key)) == m.ExistReply(0, True)
    assert rpc.call(m.GetSize(key)) == m.SizeReply(0, 1000)
    assert rpc.call(m.Remove(key)) == m.Reply(E.OBJECT_HAS_LEASE)
    assert rpc.call(m.Remove(key, True)) == m.Reply(0)
    assert rpc.call(m.GetReplicaList(key)).code == E.OBJECT_NOT_FOUND
    assert rpc.call(m.UnmountSegment(writer, m.SegmentName(name))) == m.Reply(E.ILLEGAL_CLIENT)
    assert rpc.call(m.UnmountSegment(node, m.SegmentName(name))) == m.Reply(0)


def test_batches_of_64_answer_one_result_per_key_over_rpc(rpc: RpcClient) -> None:
    node, writer = m.ClientId(_uid("node")), m.ClientId(_uid("writer"))
    rpc.call(m.MountSegment(node, HOST, seg(_uid("seg"))))
    keys = [_uid("b") for _ in range(64)]
    started = rpc.call(m.BatchPutStart(writer, keys, [4096] * 64))
    assert [r.code for r in started.results] == [0] * 64
    assert rpc.call(m.BatchPutEnd(writer, keys, list(range(64)))) == m.BatchReply([0] * 64)
    got = rpc.call(m.BatchGetReplicaList([*keys, "missing"]))
    assert [r.checksum for r in got.results[:64]] == list(range(64))
    assert got.results[64].code == E.OBJECT_NOT_FOUND
    exists = rpc.call(m.BatchExistKey(keys[:2]))
    assert [r.exists for r in exists.results] == [True, True]
    removed = rpc.call(m.BatchRemove(keys, True))
    assert removed == m.BatchReply([0] * 64)


def test_pipelined_requests_from_several_threads_all_get_their_own_reply(rpc: RpcClient) -> None:
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(50):
                payload = f"{i}-{j}".encode()
                assert rpc.call(m.Echo(payload)) == m.EchoReply(payload)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    replies = rpc.call_many([m.GetSize(f"nope-{i}") for i in range(200)])
    assert all(r.code == E.OBJECT_NOT_FOUND for r in replies)


def test_remove_all_and_remove_by_regex_count_over_rpc(rpc: RpcClient) -> None:
    tenant = m.TenantId(_uid("tenant"))
    node, writer = m.ClientId(_uid("node")), m.ClientId(_uid("writer"))
    rpc.call(m.MountSegment(node, HOST, seg(_uid("seg"), 256 * MiB)))
    n = 12_000  # more than one chunk of the chunked removal
    # The module's master drops a client silent for 1 s: the node pings at every step, or a
    # loaded machine lets it expire (and its objects with it) before the removals count them.
    for i in range(0, n, 1000):
        rpc.call(m.Ping(node))
        keys = [f"k{j}" for j in range(i, i + 1000)]
        assert all(
            r.code == 0
            for r in rpc.call(m.BatchPutStart(writer, keys, [64] * 1000, tenant=tenant)).results
        )
        rpc.call(m.BatchPutEnd(writer, keys, tenant=tenant))
    rpc.call(m.Ping(node))
    assert rpc.call(m.RemoveByRegex("^k1[0-9]{3}$", tenant=tenant)) == m.CountReply(0, 1000)
    assert rpc.call(m.RemoveByRegex("(", tenant=tenant)).code == E.INVALID_PARAMS
    rpc.call(m.Ping(node))
    assert rpc.call(m.RemoveAll(tenant=tenant)) == m.CountReply(0, n - 1000)
    assert rpc.call(m.GetSize("k5", tenant)).code == E.OBJECT_NOT_FOUND


def test_stats_over_rpc_list_segments_and_clients(rpc: RpcClient) -> None:
    node = m.ClientId(_uid("node"))
    name = _uid("seg")
    rpc.call(m.MountSegment(node, HOST, seg(name)))
    stats = rpc.call(m.Stats())
    assert isinstance(stats, m.StatsReply) and stats.code == 0
    assert any(s.name == name and s.capacity == 64 * MiB for s in stats.segments)
    assert any(c.client_id == node for c in stats.clients)


def test_silent_client_is_expired_by_the_live_master(rpc: RpcClient) -> None:
    # The module's master runs with --client-ttl 1s.
    node, writer = m.ClientId(_uid("node")), m.ClientId(_uid("writer"))
    name = _uid("seg")
    rpc.call(m.MountSegment(node, HOST, seg(name)))
    rpc.call(m.ReMountSegment(writer, HOST, []))
    key = _uid("key")
    cfg = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName(name)])
    rpc.call(m.PutStart(writer, key, 100, cfg))
    rpc.call(m.PutEnd(writer, key))

    def node_gone() -> bool:
        rpc.call(m.Ping(writer))  # the writer stays alive
        return bool(rpc.call(m.GetSegment(m.SegmentName(name))).code == E.SEGMENT_NOT_FOUND)

    wait_until(node_gone, timeout=10, interval=0.1, what="the silent node to expire")
    assert rpc.call(m.GetReplicaList(key)).code == E.OBJECT_NOT_FOUND
    assert rpc.call(m.Ping(node)).client_status is m.ClientStatus.NEED_REMOUNT
    assert rpc.call(m.Ping(writer)).client_status is m.ClientStatus.OK


def test_a_restarted_master_answers_need_remount_and_accepts_the_remount() -> None:
    port = free_port()
    first = kvpool_proc("master", "--port", str(port), name="master-1")
    with first:
        address = first.wait_ready()
        with client(address) as rpc:
            me = m.ClientId(_uid("node"))
            assert rpc.call(m.MountSegment(me, HOST, seg("s"))) == m.Reply(0)
            assert rpc.call(m.Ping(me)).client_status is m.ClientStatus.OK
            assert first.stop() == 0
            second = kvpool_proc("master", "--port", str(port), name="master-2")
            with second:
                second.wait_ready()
                # The client reconnects by itself; the new master does not know it.
                reply = wait_until(lambda: _try(rpc, m.Ping(me)), timeout=10, what="reconnect")
                assert reply.client_status is m.ClientStatus.NEED_REMOUNT
                assert rpc.call(m.ReMountSegment(me, HOST, [seg("s")])) == m.Reply(0)
                assert rpc.call(m.Ping(me)).client_status is m.ClientStatus.OK


def _try(rpc: RpcClient, req: m.Message) -> m.Message | None:
    from kvpool.errors import RpcError

    try:
        reply: m.Message = rpc.call(req, timeout=2)
        return reply
    except RpcError:
        return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_master_stops_cleanly_on_signal(sig: signal.Signals) -> None:
    proc = kvpool_proc("master", "--port", "0", name="master-sig")
    with proc:
        proc.wait_ready()
        proc.popen.send_signal(sig)
        assert proc.popen.wait(timeout=10) == 0, proc.output()
        proc.wait_for_line("stopping")


# ---------------------------------------------------------------- in-process, injected clock


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, s: float) -> None:
        with self._lock:
            self.t += s


@pytest.fixture
def clocked() -> Iterator[tuple[Clock, str, MasterServer]]:
    clock = Clock()
    server = MasterServer(
        MasterConfig(port=0, monitor_interval=0.02, seed=1), clock=clock, server_name="t"
    )
    thread = ServerThread(server, name="master-under-test")  # type: ignore[arg-type]
    with thread:
        yield clock, thread.endpoint, server


def test_monitor_expires_a_silent_client_on_the_injected_clock(
    clocked: tuple[Clock, str, MasterServer],
) -> None:
    clock, address, _ = clocked
    with client(address) as rpc:
        node = m.ClientId("node")
        rpc.call(m.MountSegment(node, HOST, seg("s")))
        clock.advance(9.9)
        assert rpc.call(m.Ping(node)).client_status is m.ClientStatus.OK
        clock.advance(10.0)
        wait_until(lambda: rpc.call(m.Stats()).segments == [], timeout=10, what="monitor to expire")
        assert rpc.call(m.Ping(node)).client_status is m.ClientStatus.NEED_REMOUNT


def test_monitor_releases_a_stale_put_start(clocked: tuple[Clock, str, MasterServer]) -> None:
    clock, address, _server = clocked
    with client(address) as rpc:
        rpc.call(m.MountSegment(m.ClientId("node"), HOST, seg("s")))
        writer = m.ClientId("writer")  # never registers: its puts are released by age alone
        assert rpc.call(m.PutStart(writer, "k", MiB)).code == 0
        assert rpc.call(m.Stats()).used == MiB
        clock.advance(599)
        for _ in range(5):
            rpc.call(m.Ping(m.ClientId("node")))
        assert rpc.call(m.Stats()).used == MiB
        clock.advance(2)
        rpc.call(m.Ping(m.ClientId("node")))
        wait_until(lambda: rpc.call(m.Stats()).used == 0, timeout=10, what="stale release")
        assert rpc.call(m.GetReplicaList("k")).code == E.OBJECT_NOT_FOUND


def test_monitor_sweeps_objects_of_an_unmounted_segment(
    clocked: tuple[Clock, str, MasterServer],
) -> None:
    _, address, _server = clocked
    with client(address) as rpc:
        node, writer = m.ClientId("node"), m.ClientId("writer")
        rpc.call(m.MountSegment(node, HOST, seg("s")))
        keys = [f"k{i}" for i in range(500)]
        rpc.call(m.BatchPutStart(writer, keys, [64] * 500))
        rpc.call(m.BatchPutEnd(writer, keys))
        assert rpc.call(m.Stats()).objects == 500
        rpc.call(m.UnmountSegment(node, m.SegmentName("s")))
        wait_until(lambda: rpc.call(m.Stats()).objects == 0, timeout=10, what="sweep")


def test_a_batch_larger_than_the_chunk_is_served_in_sub_batches_in_order() -> None:
    server = MasterServer(MasterConfig(port=0, batch_chunk_keys=100, seed=1), server_name="t")
    thread = ServerThread(server, name="master-chunks")  # type: ignore[arg-type]
    with thread, client(thread.start().endpoint) as rpc:
        rpc.call(m.MountSegment(m.ClientId("node"), HOST, seg("s")))
        w = m.ClientId("w")
        n = 1050
        keys = [f"k{i}" for i in range(n)]
        groups = [f"g{i % 7}" for i in range(n)]
        cfg = m.ReplicateConfigMsg(group_ids=groups)
        started = rpc.call(m.BatchPutStart(w, keys, [64 + i for i in range(n)], cfg))
        assert len(started.results) == n and all(r.code == 0 for r in started.results)
        assert [r.replicas[0].size for r in started.results] == [64 + i for i in range(n)]
        ended = rpc.call(m.BatchPutEnd(w, keys, list(range(n))))
        assert ended.codes == [0] * n
        got = rpc.call(m.BatchGetReplicaList([*keys, "missing"]))
        assert [r.checksum for r in got.results[:n]] == list(range(n))
        assert got.results[n].code == E.OBJECT_NOT_FOUND
        obj = server.service.index.get("default", "k1049")
        assert obj is not None and obj.group_id == f"g{1049 % 7}"
        exists = rpc.call(m.BatchExistKey(keys))
        assert all(r.exists for r in exists.results)
        bad = rpc.call(m.BatchPutStart(w, keys, [1] * (n - 1)))
        assert [r.code for r in bad.results] == [E.INVALID_PARAMS] * n
        removed = rpc.call(m.BatchRemove(keys, True))
        assert removed.codes == [0] * n


def test_a_batch_commit_larger_than_the_chunk_keeps_each_key_with_its_range() -> None:
    server = MasterServer(MasterConfig(port=0, batch_chunk_keys=100, seed=1), server_name="t")
    thread = ServerThread(server, name="master-commit-chunks")  # type: ignore[arg-type]
    with thread, client(thread.start().endpoint) as rpc:
        rpc.call(m.MountSegment(m.ClientId("node"), HOST, seg("s")))
        w = m.ClientId("w")
        arena = rpc.call(m.ReserveArena(w, 1 << 20))
        assert isinstance(arena, m.ArenaReply) and arena.code == 0
        n = 450
        keys = [f"c{i}" for i in range(n)]
        offs = [arena.offset + 128 * i for i in range(n)]
        groups = [f"g{i % 3}" for i in range(n)]
        cfg = m.ReplicateConfigMsg(group_ids=groups)
        sizes = [65 + i % 60 for i in range(n)]
        done = rpc.call(m.BatchPutCommit(w, arena.arena_id, keys, sizes, offs, list(range(n)), cfg))
        assert done.codes == [0] * n
        got = rpc.call(m.BatchGetReplicaList(keys))
        assert [r.replicas[0].offset for r in got.results] == offs
        assert [r.size for r in got.results] == sizes
        assert [r.checksum for r in got.results] == list(range(n))
        obj = server.service.index.get("default", "c449")
        assert obj is not None and obj.group_id == "g2"
        bad = rpc.call(m.BatchPutCommit(w, arena.arena_id, ["x"] * 200, [64] * 199, offs[:200]))
        assert bad.codes == [E.INVALID_PARAMS] * 200


def test_a_locations_batch_larger_than_the_chunk_renumbers_segments_across_parts() -> None:
    server = MasterServer(MasterConfig(port=0, batch_chunk_keys=50, seed=3), server_name="t")
    thread = ServerThread(server, name="master-locations-chunks")  # type: ignore[arg-type]
    with thread, client(thread.start().endpoint) as rpc:
        for name in ("s1", "s2", "s3"):
            rpc.call(m.MountSegment(m.ClientId(f"node-{name}"), HOST, seg(name)))
        w = m.ClientId("w")
        n = 240
        keys = [f"l{i}" for i in range(n)]
        cfg = m.ReplicateConfigMsg(replica_num=2)
        assert all(r.code == 0 for r in rpc.call(m.BatchPutStart(w, keys, [64] * n, cfg)).results)
        assert rpc.call(m.BatchPutEnd(w, keys, list(range(n)))).codes == [0] * n
        asked = [*keys, "missing"]
        full = rpc.call(m.BatchGetReplicaList(asked))
        loc = rpc.call(m.BatchGetLocations(asked))
        assert isinstance(loc, m.LocationsReply)
        assert loc.codes == [r.code for r in full.results]
        assert loc.checksums[:n] == list(range(n)) and loc.sizes[n] == 0
        assert len(set(loc.segments)) == len(loc.segments) <= 3
        for i, r in enumerate(full.results[:n]):
            p = loc.places[i]
            got = [(loc.segments[p[k]], p[k + 1]) for k in range(0, len(p), 2)]
            assert got == [(d.segment, d.offset) for d in r.replicas]


def test_a_node_executes_a_move_task_over_rpc(rpc: RpcClient) -> None:
    """The node's side of replica tasks on the wire: the test is the node (it fetches its task,
    "copies" by recording the request, reports) and the master switches the metadata."""
    node1, node2, writer = (m.ClientId(_uid(p)) for p in ("node", "node", "writer"))
    src, dst = _uid("src"), _uid("dst")
    assert rpc.call(m.MountSegment(node1, HOST, seg(src))) == m.Reply(0)
    assert rpc.call(m.MountSegment(node2, HOST, seg(dst))) == m.Reply(0)
    assert rpc.call(m.ReMountSegment(writer, HOST, [])) == m.Reply(0)
    key = _uid("key")
    cfg = m.ReplicateConfigMsg(preferred_segments=[m.SegmentName(src)])
    assert rpc.call(m.PutStart(writer, key, 5000, cfg)).code == 0
    assert rpc.call(m.PutEnd(writer, key, 1234)) == m.Reply(0)

    created = rpc.call(m.CreateMoveTask(key, m.SegmentName(src), m.SegmentName(dst)))
    assert isinstance(created, m.TaskReply) and created.code == 0
    assert rpc.call(m.Ping(node1)).pending_tasks == 1
    fetched = rpc.call(m.FetchTasks(node1, 8))
    assert isinstance(fetched, m.FetchTasksReply) and fetched.code == 0
    (task,) = fetched.tasks
    copies: list[tuple[str, int, str, int, int]] = []
    for target in task.targets:  # the node's transfer engine would copy the bytes here
        copies.append(
            (task.source.segment, task.source.offset, target.segment, target.offset, task.size)
        )
    assert copies == [(src, task.source.offset, dst, task.targets[0].offset, 5000)]
    assert {s.name for s in task.segments} == {src, dst} and task.checksum == 1234
    assert rpc.call(m.QueryTask(task.task_id)).status is m.TaskStatus.PROCESSING
    # The source stays readable until the node reports.
    assert [d.segment for d in rpc.call(m.GetReplicaList(key)).replicas] == [src]

    assert rpc.call(m.MarkTaskComplete(node1, task.task_id, True)) == m.Reply(0)
    done = rpc.call(m.QueryTask(task.task_id))
    assert (done.code, done.status, done.task_type, done.key) == (
        0,
        m.TaskStatus.SUCCESS,
        m.TaskType.MOVE,
        key,
    )
    got = rpc.call(m.GetReplicaList(key))
    assert [(d.segment, d.offset) for d in got.replicas] == [(dst, task.targets[0].offset)]
    assert got.checksum == 1234
    assert rpc.call(m.Remove(key, True)) == m.Reply(0)
