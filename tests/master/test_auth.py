"""A master with an auth file: who gets in, what each role may ask, tenants from tokens, SIGHUP.

A real `kvpool master --auth-file` child process on loopback; clients are the real `RpcClient`
and raw sockets (`RawConn`) that skip the proof, on TCP and on the abstract Unix socket."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kvpool.errors import ErrorCode, InvalidParams, PermissionDenied, Unauthenticated
from kvpool.master.auth import RequestPolicy, load_auth_file
from kvpool.protocol import messages as m
from kvpool.protocol.framing import ERROR_FLAG, ErrorReply
from kvpool.rpc import RpcClient
from kvpool.rpc.auth import Principal, Role
from kvtest.procs import Proc, kvpool_proc, run_kvpool, wait_until
from rpc.rpc_testkit import RawConn

E = ErrorCode
MiB = 1 << 20
CLUSTER = "kvpool"
A_CLIENT = "tenant-a-client-token-000000000001"
A_NODE = "tenant-a-node-token-0000000000000002"
B_CLIENT = "tenant-b-client-token-000000000003"
ADMIN = "the-admin-token-00000000000000000004"
TOKENS = f"""
tokens:
  - {{token: {A_CLIENT}, tenant: a, role: client}}
  - {{token: {A_NODE}, tenant: a, role: node}}
  - {{token: {B_CLIENT}, tenant: b, role: client}}
  - {{token: {ADMIN}, tenant: ops, role: admin}}
"""


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def seg(name: str, size: int = 64 * MiB) -> m.SegmentInfo:
    return m.SegmentInfo(m.SegmentName(name), size, m.HostId("h"), "127.0.0.1:1", "")


@pytest.fixture(scope="module")
def auth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "auth.yaml"
    path.write_text(TOKENS)
    return path


@pytest.fixture(scope="module")
def master_proc(auth_file: Path) -> Iterator[Proc]:
    proc = kvpool_proc("master", "--port", "0", "--auth-file", str(auth_file))
    try:
        proc.wait_ready()
        yield proc
    finally:
        assert proc.stop() == 0, proc.output()


@pytest.fixture(scope="module")
def master(master_proc: Proc) -> str:
    return master_proc.wait_ready()


def rpc(address: str, token: str | None, name: str = "t") -> RpcClient:
    return RpcClient(
        address,
        response_type=m.Response,
        client_name=name,
        timeout=10,
        token=None if token is None else token.encode(),
    )


def objects(master: str) -> int:
    with rpc(master, ADMIN) as c:
        reply = c.call_as(m.Stats(), m.StatsReply)
    return reply.objects


@pytest.mark.parametrize("token", [None, "not-a-token-of-this-master-0000000"])
def test_no_token_or_a_wrong_one_is_refused_before_any_request(
    master: str, token: str | None
) -> None:
    with rpc(master, token) as c, pytest.raises(Unauthenticated) as info:
        c.call(m.RemoveAll(force=True, tenant="a"))
    assert info.value.code == E.UNAUTHENTICATED


def test_a_raw_connection_that_skips_the_proof_gets_nothing(master: str) -> None:
    with rpc(master, ADMIN) as c:
        c.connect()
        unix = c.transport == "unix"
    endpoints = [master]
    if unix:
        with RawConn(master) as raw:
            endpoints.append(raw.hello(cluster_id=CLUSTER).unix_address)
    for endpoint in endpoints:
        with RawConn(endpoint) as raw:
            assert raw.hello(cluster_id=CLUSTER).challenge
            raw.request(1, m.RemoveAll(force=True))
            rid, payload = raw.recv_frame()
            assert rid & ERROR_FLAG
            assert msgspec.msgpack.decode(payload, type=ErrorReply).code == E.UNAUTHENTICATED
            assert raw.closed_by_peer()
    assert objects(master) >= 0


def test_a_client_cannot_act_in_another_tenant_and_nothing_changes(master: str) -> None:
    writer = m.ClientId(_uid("w"))
    before = objects(master)
    with rpc(master, B_CLIENT) as c:
        with pytest.raises(PermissionDenied) as info:
            c.call(m.PutStart(writer, "k", 100, tenant=m.TenantId("a")))
        assert info.value.code == E.PERMISSION_DENIED
        with pytest.raises(PermissionDenied):
            c.call(m.GetReplicaList("k", tenant=m.TenantId("a")))
        with pytest.raises(PermissionDenied):
            c.call(m.PutStart(writer, "k", 100))  # the default tenant is not b's either
        assert c.auth_tenant == "b" and c.auth_role == "client"
    assert objects(master) == before


@pytest.mark.parametrize(
    "request_",
    [
        m.RemoveAll(force=True, tenant=m.TenantId("a")),
        m.RemoveByRegex(".*", force=True, tenant=m.TenantId("a")),
        m.CreateCopyTask("k", [], tenant=m.TenantId("a")),
        m.QueryTask("t"),
        m.FollowLog("standby", 1, 0),
        m.MountSegment(m.ClientId("x"), m.HostId("h"), seg("s")),
        m.ReMountSegment(m.ClientId("x"), m.HostId("h"), [seg("s")]),
        m.FetchTasks(m.ClientId("x")),
    ],
    ids=lambda r: type(r).__name__,
)
def test_a_client_token_calling_an_admin_or_node_request_is_denied(
    master: str, request_: object
) -> None:
    with rpc(master, A_CLIENT) as c, pytest.raises(PermissionDenied) as info:
        c.call(request_)
    assert info.value.code == E.PERMISSION_DENIED


def test_roles_put_get_and_stats_redaction(master: str) -> None:
    node, writer = m.ClientId(_uid("node")), m.ClientId(_uid("writer"))
    name = _uid("seg")
    key = _uid("key")
    tenant = m.TenantId("a")
    with rpc(master, A_NODE) as n, rpc(master, A_CLIENT) as c, rpc(master, ADMIN) as admin:
        assert n.call(m.MountSegment(node, m.HostId("h"), seg(name))) == m.Reply(0)
        assert c.call(m.ReMountSegment(writer, m.HostId("h"))).code == 0  # registration
        started = c.call(m.PutStart(writer, key, 1000, tenant=tenant))
        assert started.code == 0
        assert c.call(m.PutEnd(writer, key, 7, tenant=tenant)) == m.Reply(0)
        assert c.call(m.GetReplicaList(key, tenant=tenant)).code == 0
        seen = c.call_as(m.Stats(), m.StatsReply)
        assert seen.segments and all(s.client_id == "" for s in seen.segments)
        assert all(cl.client_id == "" for cl in seen.clients)
        got = c.call_as(m.GetSegment(m.SegmentName(name)), m.SegmentReply)
        assert got.segment is not None and got.segment.client_id == ""
        full = admin.call_as(m.Stats(), m.StatsReply)
        assert node in {s.client_id for s in full.segments}
        # The admin acts in any tenant, and may unmount a live node's segment.
        assert admin.call(m.Remove(key, True, tenant=tenant)) == m.Reply(0)
        other = m.ClientId(_uid("other-node"))
        assert n.call(m.UnmountSegment(other, m.SegmentName(name))) == m.Reply(E.ILLEGAL_CLIENT)
        assert admin.call(m.UnmountSegment(node, m.SegmentName(name))) == m.Reply(0)


def test_sighup_reloads_the_tokens_and_a_bad_file_keeps_them(
    master_proc: Proc, master: str, auth_file: Path
) -> None:
    rotated = "tenant-a-rotated-token-00000000000005"
    try:
        auth_file.write_text(TOKENS + f"  - {{token: {rotated}, tenant: a, role: client}}\n")
        os.kill(master_proc.pid, signal.SIGHUP)

        def rotated_works() -> bool:
            try:
                with rpc(master, rotated) as c:
                    c.call(m.Echo(b""))
                return True
            except Unauthenticated:
                return False

        wait_until(rotated_works, 10, what="the reloaded token to be accepted")
        auth_file.write_text("tokens: [not a mapping]\n")
        os.kill(master_proc.pid, signal.SIGHUP)
        master_proc.wait_for_line("auth file not reloaded")
        with rpc(master, rotated) as c:
            assert c.call(m.Echo(b"x")) == m.EchoReply(b"x")
    finally:
        auth_file.write_text(TOKENS)
        os.kill(master_proc.pid, signal.SIGHUP)
    wait_until(lambda: not rotated_works(), 10, what="the rotated token to be dropped")


def test_status_proves_its_token_from_a_file_or_the_environment(
    master: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN + "\n")
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_AUTH_TOKEN"}

    def status(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_kvpool("status", "--master", master, "--json", *args, env={**env, **extra})

    assert status("--token-file", str(token_file)).returncode == 0
    assert status(KVPOOL_AUTH_TOKEN=ADMIN).returncode == 0
    refused = status()
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr + refused.stdout


def test_a_store_proves_its_token_and_acts_in_its_tenant(master: str) -> None:
    from kvpool import Store

    with Store(master, segment_size="16MiB", token=A_NODE, protocol="tcp") as store:
        store.put("hello", b"world")
        assert store.get("hello") == b"world"
        with rpc(master, ADMIN) as admin:  # the Store acts in its token's tenant
            assert admin.call(m.ExistKey("hello", tenant=m.TenantId("a"))) == m.ExistReply(0, True)
            assert admin.call(m.ExistKey("hello")) == m.ExistReply(0, False)
    with pytest.raises(Unauthenticated):
        Store(master, token="")


# ---------------------------------------------------------------- no processes


def test_the_auth_file_is_validated_without_quoting_tokens(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    for text, message in [
        ("tokens: []", "non-empty list"),
        ("tokens: [{token: secret-secret-secret, tenant: a, role: root}]", "role"),
        ("tokens: [{token: secret-secret-secret, role: client}]", "tenant"),
        ("tokens: [{token: secret-secret-secret, tenant: a, role: client, x: 1}]", "expected"),
        ("tokens: {", "auth file"),
    ]:
        path.write_text(text)
        with pytest.raises(InvalidParams, match=message) as info:
            load_auth_file(path)
        assert "secret-secret" not in info.value.message


def test_the_policy_denies_request_types_it_does_not_list() -> None:
    class NewAdminRequest(m.Message):
        pass

    policy = RequestPolicy()
    for role in (Role.CLIENT, Role.NODE):
        with pytest.raises(PermissionDenied):
            policy.check(NewAdminRequest(), Principal("a", role))
    policy.check(NewAdminRequest(), Principal("ops", Role.ADMIN))
