"""Review finding (round 3): DFS file ids start at 0 again when a master restarts without
`--data-dir`, so a writer of the previous run cleans up a file of the new run.

src/kvpool/master/dfs.py `DfsTier.allocate` (docstring): "an id is not handed out again until
the space wrapped (16 TiB of DFS puts later), so a writer cleaning up after a failed put never
removes the file of a later put that got its id"; docs/parts/tiers.md: "an id is not handed
out again until 16 TiB of DFS puts later". That holds within one master's memory only:
`DfsTier.__init__` sets `_next = 0`, and only `restore` (a `--data-dir` restart or a promoted
standby) moves it. A master restarted without a data directory (the default) hands out ids
from 0 again while clients of the previous run may still be writing theirs. Such a writer's
put fails (its master is gone), and its clean-up (`kvpool.client.dfs.remove_failed`, also
`write`'s own unlink of `<id>.tmp`) removes `<root>/kvpool-dfs/<id>`: the file of the new
run's object that got the same id. The object has lost its DFS copy (the master's check then
drops the replica; once its memory goes too, the object is gone), although it was stored after
the restart and nothing happened to it.

The interleaving is held, not hoped for: the old writer's `<id>.tmp` is a FIFO this test reads,
so the writer is inside its file write (past PutStart) for as long as the test does not read;
the FIFO is moved aside (the writer keeps its descriptor; a partly written regular `<id>.tmp`
takes its place, as the directory shows a write in progress), the master is killed (-9) and
started again on the same DFS root, a new put takes id 0 and completes; then the test reads
the FIFO to its end and the old writer goes on: its rename fails, its put fails, and it
removes what it takes for its own file.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

from kvpool.client import Store
from kvpool.protocol.tiers import DFS_DIR, dfs_file
from kvtest.dfs import DFS, dfs_pool
from kvtest.pool import PoolFactory, pool  # noqa: F401
from kvtest.replicas import dfs_file_id
from kvtest.stores import open_store
from kvtest.values import MiB


def test_a_writer_of_the_previous_master_run_never_removes_a_new_objects_file(
    pool: PoolFactory,  # noqa: F811
    tmp_path: Path,
    stores: list[Store],
) -> None:
    root = tmp_path / "dfs"
    first = dfs_pool(pool, root, nodes=0)
    first_id_tmp = dfs_file(str(root), 0) + ".tmp"  # a fresh master's first DFS id is 0
    assert os.path.isdir(root / DFS_DIR)
    os.mkfifo(first_id_tmp)
    # Opened for reading first, so the writer's open does not block; its write then blocks
    # once the pipe is full, while the test does not read.
    fifo = os.open(first_id_tmp, os.O_RDONLY | os.O_NONBLOCK)
    old_errors: list[BaseException] = []
    try:
        old = open_store(stores, first.address, segment_size="8MiB", rpc_timeout=3.0)

        def old_put() -> None:
            try:
                old.put("old", b"o" * (2 * MiB), DFS)
            except BaseException as exc:  # the expected outcome: its master is gone
                old_errors.append(exc)

        writer = threading.Thread(target=old_put, name="old-run writer")
        writer.start()
        try:
            # The old writer is writing its file (id 0): the pipe has its first bytes.
            readable, _, _ = select.select([fifo], [], [], 20.0)
            assert readable, "the old run's put never began writing its file"
            os.rename(first_id_tmp, tmp_path / "held-fifo")  # its descriptor stays valid
            # What the directory shows of a write in progress: its `<id>.tmp`, partly written
            # (the real writer's file; here the FIFO stands aside so no one else blocks on it).
            Path(first_id_tmp).write_bytes(b"o" * 65536)
            first.master.kill9()

            second = dfs_pool(pool, root, nodes=0)  # no --data-dir: ids from 0 again
            new = open_store(stores, second.address, segment_size="8MiB", rpc_timeout=10.0)
            value = b"n" * MiB
            assert new.put("new", value, DFS)
            file_id = dfs_file_id(new, "new")
            assert Path(dfs_file(str(root), file_id)).read_bytes() == value
        finally:
            # Let the old writer finish its write (read the pipe to its end), then its put.
            os.set_blocking(fifo, True)
            while os.read(fifo, MiB):
                pass
            writer.join(timeout=60)
        assert not writer.is_alive()
    finally:
        os.close(fifo)
    assert old_errors  # its put failed (its master was killed)
    # The new object's file is untouched by the old run's clean-up.
    path = Path(dfs_file(str(root), file_id))  # (id 0 on main: the old run's id)
    assert path.exists(), "the old run's writer removed the new object's DFS file"
    assert path.read_bytes() == value
    assert new.get("new") == value
