"""Review finding (round 3): an upsert in place of an object promoted back from its DFS file.

The client finds an answer's DFS replica by its place: "the master's DFS copy comes last in a
PutStart answer" (src/kvpool/client/writer/base.py `_write_replicas`, `replicas[-1].kind ==
_DFS`; src/kvpool/client/writer/batches.py `_put_batch_started`; src/kvpool/client/dfs.py
`remove_failed`). That holds for a new put (`_put_one` appends the DFS replica) and for an
upsert onto new ranges (case C appends it). It does not hold for an upsert *in place* (case B
of src/kvpool/master/writes.py `_upsert_one`: same size, no read lease), which answers the
object's replicas in their stored order (`core.rewrite_object`, `live = ...obj.replicas`):
a promotion from DFS, merged this session, adds the memory copy *after* the DFS replica
(`MetadataCore.add_replicas` appends), so the answer is [DFS, MEMORY]. The writer then takes
the DFS replica for a memory segment named `kvpool-dfs` and the MEMORY one for the last: the
file write is sent to the transfer engine, which knows no such segment (SEGMENT_NOT_FOUND), and
the put is revoked with the key (an in-place rewrite already made the old value unreadable).
A put that names its segments is not started again: the upsert raises and the key is gone.
Without named segments the writer starts it again (counted in `put_stats.retries`), now as a
new put of a missing key: it succeeds, but the key did not exist in between (readers get
OBJECT_NOT_FOUND, another client's `put` may take it) and the file is another one.
docs/parts/tiers.md ("Upserts"): "an object that has one keeps one through every upsert: in
place at the same size (the file is written again, temporary file and rename)".

A real pool (master with `--dfs-root`, one node), the promotion as in
tests/tiers/test_dfs_promotion.py: the node stopped (its segment unmounted) so the file is the
only copy, a Store that sees the directory and gives memory runs the promotion; then an upsert
of the same size asking for the copy again (`dfs_replica_num=1`: PutStart, no arena).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.client import Store
from kvpool.client.replicate import ReplicateConfig
from kvpool.protocol.messages import ReplicaKind
from kvpool.protocol.tiers import dfs_file
from kvtest.dfs import DFS, dfs_pool, promote_through_a_helper, wait_dfs_only
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.replicas import dfs_file_id
from kvtest.stores import open_store
from kvtest.values import MiB


def _value(tag: bytes) -> bytes:
    return (tag * 16)[:16] * (MiB // 16)


def _promoted(p: Pool, s: Store, root: Path, stores: list[Store], key: str) -> None:
    """`key`'s memory gone, then promoted back from its file: DFS stored first."""
    p.stop_node(0)  # (its segment unmounted: no silent replica of it is left)
    wait_dfs_only(s, [key])
    promote_through_a_helper(
        p, s, stores, root, key, _value(b"old"), f"{key} promoted back to memory"
    )


@pytest.mark.parametrize("batch", [False, True], ids=["upsert", "batch_upsert"])
def test_an_upsert_in_place_of_a_promoted_dfs_object_keeps_it(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
    batch: bool,
) -> None:
    root = tmp_path / "dfs"
    # No read lease: a same-size upsert is done in place (case B), as after any lease.
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s")
    s = open_store(stores, p.address)
    assert s.put("k", _value(b"old"), DFS)
    _promoted(p, s, root, stores, "k")
    where = {ReplicaKind(r.kind): r for r in s.get_replica_desc("k")}
    file_id = where[ReplicaKind.DFS].offset
    # The caller names where its copy goes (the segment the value already is on): such a put
    # is never started again elsewhere, so the first attempt's outcome is the answer.
    cfg = ReplicateConfig(
        dfs_replica_num=1, preferred_segments=(where[ReplicaKind.MEMORY].segment,)
    )

    new = _value(b"new")
    if batch:
        assert s.batch_upsert(["k"], [new], cfg) == [0]
    else:
        s.upsert("k", new, cfg)
    assert s.get("k") == new
    after = {ReplicaKind(r.kind): r for r in s.get_replica_desc("k")}
    # In place (docs/parts/tiers.md, "Upserts"): the same file, written again.
    assert after[ReplicaKind.DFS].offset == file_id
    assert Path(dfs_file(str(root), file_id)).read_bytes() == new


def test_a_plain_upsert_of_a_promoted_dfs_object_is_done_in_place_at_once(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    p = dfs_pool(pool, root, "--default-kv-lease-ttl", "0s")
    s = open_store(stores, p.address)
    assert s.put("k", _value(b"old"), DFS)
    _promoted(p, s, root, stores, "k")
    file_id = dfs_file_id(s, "k")
    before = s.put_stats.retries

    new = _value(b"new")
    s.upsert("k", new, DFS)
    assert s.get("k") == new
    assert s.put_stats.retries == before  # no write failed: nothing was started again
    after = dfs_file_id(s, "k")
    assert after == file_id  # in place: the same file, written again
    assert Path(dfs_file(str(root), file_id)).read_bytes() == new
