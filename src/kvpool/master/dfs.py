"""`DfsTier`: the master's side of the DFS tier, a directory every node and client sees
(`kvpool master --dfs-root PATH`; docs/parts/tiers.md, "The DFS tier").

A put asking for `dfs_replica_num=1` gets, beside its memory replicas, one replica of kind DFS
on a segment that belongs to no node (`segment`, number 0, never in the segment table, so no
unmount, expiry or placement ever sees it): its offset, allocated in a large virtual space, is
the id of the object's file `<root>/kvpool-dfs/<id>`. The client writes that file itself
(`<id>.tmp`, then a rename) before its PutEnd, and PutEnd makes the replica COMPLETE with the
rest. The replica outlives every node; it goes with its object (Remove, overwrite, eviction of
the object) or when its file is found gone:

* freeing the replica (`on_free`, from `MetadataCore.on_disk_free`) removes both the file and
  a temporary one left by a write that never finished; a put revoked or preempted while its
  file was being written is freed the same way (its ranges parked first, while the writer may
  still be writing), so it leaves no file: counted in `abandoned` when a file was found;
* a reader that finds the file gone reports the replica bad (it is dropped when the object has
  another readable replica), and `check` looks for the files of up to `per_round` complete
  replicas per round, round robin, dropping those whose file vanished (`vanished`);
* `sweep` removes orphan files: it reads up to `per_round` entries of the directory per round
  (one directory iterator, resumed round after round) and removes a file (or a `.tmp`) whose
  id no replica holds (`_ids`: every id allocated and not yet freed, in-flight puts and parked
  ranges included) once it is older than `orphan_grace` (its modification time): files of a
  master run without `--data-dir`, written after the last logged record, or left by a writer
  that died. Counted in `orphans`. Only a leading master sweeps (`leading`: a standby's
  metadata is not the cluster's), and never a name that is not a file id.

Ids are never handed out twice to files that may meet: a fresh tier (`__init__`: a start or a
restart, with or without `--data-dir`) starts its ids past every id named in the directory
(`<id>` and `<id>.tmp`, one scan of at most `START_SCAN_LIMIT` names) plus `START_GAP`, so a
writer of an earlier run that fails its put after the restart removes only its own file (the
gap covers ids that run handed out whose files were not there yet). An HA master scans again
when it begins to lead (`_lead`: its first `tick` or `allocate` while leading), past what the
old leader wrote since this master started; `restore` moves the ids past restored replicas.

`tick` runs both every `check_interval`. File operations are unlinks and stats of one path
each, on the master's loop, bounded per round.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Final

from kvpool.master.core import MetadataCore
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ClientId, HostId, ReplicaKind, ReplicaStatus
from kvpool.protocol.tiers import DFS_DIR, DFS_ROOT_FILE, DFS_SEGMENT, dfs_file

__all__ = ["DfsTier"]

log = logging.getLogger(__name__)

SPACE: Final = 1 << 44
"""The virtual space DFS file ids are allocated in (replica ids keep 44 bits of offset)."""
START_GAP: Final = 1 << 36
"""Ids skipped past the highest id found at a start (module docstring): puts an earlier run
answered whose files did not exist yet; 256 restarts before the space wraps."""
ROOTS_KEPT: Final = 16
"""Roots `DFS_ROOT_FILE` keeps (the last named)."""
ROOTS_FILE_MAX: Final = 1 << 16
"""Characters of `DFS_ROOT_FILE` read at most."""
START_SCAN_LIMIT: Final = 1 << 22
"""Directory entries read at most by a start's scan (names only, no stat)."""


class DfsTier:
    """The DFS replicas of one master (module docstring). Used on the master's loop only."""

    def __init__(
        self,
        core: MetadataCore,
        root: str,
        per_round: int,
        *,
        check_interval: float = 0.1,
        orphan_grace: float = 300.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._core = core
        self.root = root
        self.per_round = per_round
        self.check_interval = check_interval
        self.orphan_grace = orphan_grace
        self._wall = wall
        self._due = 0.0
        self._ids: set[int] = set()
        """File ids allocated and not freed: a file named by one is never an orphan."""
        self._scan: Iterator[os.DirEntry[str]] | None = None
        self.leading: Callable[[], bool] | None = None
        """Whether this master leads (None: it always does, no HA); only a leader sweeps."""
        os.makedirs(os.path.join(root, DFS_DIR), exist_ok=True)
        _name_root(root)
        self.segment = Segment(
            number=0,
            name=DFS_SEGMENT,
            size=SPACE,
            client_id=ClientId(""),
            host_id=HostId(""),
            endpoint=root,
            shm_path="",
            alignment=core.config.alignment,
            kind=ReplicaKind.DFS,
        )
        self._complete: OrderedDict[int, ObjectMeta] = OrderedDict()
        self._next = self._past_files()
        self._led = False
        """Whether `_lead` ran (an HA master that begins to lead scans once more)."""
        self.counters: dict[str, int] = dict.fromkeys(
            ("written", "removed", "abandoned", "vanished", "orphans"), 0
        )

    def allocate(self, size: int) -> Replica | None:
        """A PROCESSING DFS replica for a put of `size` bytes. Its file id (the offset) is taken
        in increasing order, not the lowest free one: an id is not handed out again until the
        space wrapped (16 TiB of DFS puts later), so a writer cleaning up after a failed put
        never removes the file of a later put that got its id."""
        if not self._led:
            self._lead()
        seg = self.segment
        aligned = self._core.aligned(size)
        offset = self._next if self._next + aligned <= SPACE else 0
        if not seg.allocator.alloc_at(offset, aligned):
            # Taken: ranges parked by a restart (puts in flight when the master died) or the
            # space wrapped. The next free place after it, else the first from the start
            # (O(free blocks), on a collision only).
            found = self._free_after(offset, aligned)
            if found is None or not seg.allocator.alloc_at(found, aligned):
                return None
            offset = found
        self._next = offset + aligned
        self._ids.add(offset)
        seg.objects += 1
        return Replica(seg, offset, ReplicaStatus.PROCESSING, ReplicaKind.DFS)

    def _lead(self) -> None:
        """This master begins to hand out ids: an HA master (`leading` set) starts past the
        files another leader wrote since this tier was made (a promoted standby)."""
        self._led = True
        if self.leading is not None:
            self._next = max(self._next, self._past_files())

    def _past_files(self) -> int:
        """Where ids start so that none names a file in the directory: past the highest id
        there plus `START_GAP` (0 when there is none or the directory cannot be read)."""
        top = -1
        try:
            with os.scandir(os.path.join(self.root, DFS_DIR)) as scan:
                for n, entry in enumerate(scan):
                    if n >= START_SCAN_LIMIT:
                        log.warning(
                            "DFS: more than %d entries in %s; new ids start past the first %d",
                            START_SCAN_LIMIT,
                            self.root,
                            START_SCAN_LIMIT,
                        )
                        break
                    file_id = _file_id(entry.name)
                    if file_id is not None and file_id > top:
                        top = file_id
        except OSError as exc:
            log.warning("DFS: cannot list %s for the ids in use: %s", self.root, exc)
            return 0
        if top < 0:
            return 0
        start = self._core.aligned(top + 1) + START_GAP
        return start if start < SPACE else 0  # wrapped: `allocate` finds free ids from 0

    def _free_after(self, start: int, aligned: int) -> int | None:
        """The first offset at or after `start` where `aligned` bytes are free, else the
        first such offset from 0; None when no free block is large enough."""
        first: int | None = None
        for off, n in self.segment.allocator.free_blocks():
            at = max(off, start)
            if off + n - at >= aligned:
                return at
            if first is None and n >= aligned:
                first = off
        return first

    def on_complete(self, obj: ObjectMeta) -> None:
        """`obj` (with a DFS replica) became readable: its file is checked from now on."""
        for r in obj.replicas:
            if r.segment is self.segment:
                self._complete[r.offset] = obj
                self.counters["written"] += 1

    def restore(self, obj: ObjectMeta, replica: Replica) -> None:
        """`replica` of `obj` came back with a restart (`--data-dir`) or a promoted standby's
        copy: its file is checked from now on, and new ids are taken after it (in order)."""
        self._complete[replica.offset] = obj
        self._ids.add(replica.offset)
        self._next = max(self._next, replica.offset + self._core.aligned(obj.size))

    def on_free(self, offset: int) -> None:
        """The DFS replica of file id `offset` was freed: remove its file and a temporary one."""
        self._complete.pop(offset, None)
        self._ids.discard(offset)
        path = dfs_file(self.root, offset)
        for name, what in ((path, "removed"), (path + ".tmp", "abandoned")):
            try:
                os.unlink(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("DFS: cannot remove %s: %s", name, exc)
                continue
            self.counters[what] += 1

    def tick(self, now: float) -> None:
        """A round of `check` and `sweep` when `check_interval` passed since the last one
        (`now`: the master's clock)."""
        if now < self._due:
            return
        self._due = now + self.check_interval
        if not self._led and self.leading is not None and self.leading():
            self._lead()
        self.check()
        if self.leading is None or self.leading():
            self.sweep()

    def sweep(self) -> int:
        """Look at up to `per_round` entries of the directory (resuming where the last round
        stopped) and remove the orphan files among them (module docstring); answers how many
        were removed."""
        if self._scan is None:
            try:
                self._scan = os.scandir(os.path.join(self.root, DFS_DIR))
            except OSError:
                return 0  # the storage is away: the next round tries again
        scan = self._scan
        removed = 0
        wall = self._wall()
        for _ in range(self.per_round):
            try:
                entry = next(scan, None)
            except OSError:
                entry = None
            if entry is None:  # the end of the directory: the next round starts over
                self.close()
                break
            file_id = _file_id(entry.name)
            if file_id is None or file_id in self._ids:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or wall - st.st_mtime < self.orphan_grace:
                continue
            try:
                os.unlink(entry.path)
            except OSError as exc:
                if not isinstance(exc, FileNotFoundError):
                    log.warning("DFS: cannot remove the orphan file %s: %s", entry.path, exc)
                continue
            removed += 1
        if removed:
            self.counters["orphans"] += removed
            log.info("DFS: %d orphan file(s) removed", removed)
        return removed

    def close(self) -> None:
        """Release the directory iterator of `sweep` (idempotent)."""
        scan, self._scan = self._scan, None
        close = getattr(scan, "close", None)
        if close is not None:
            close()

    def check(self) -> int:
        """Look for the files of up to `per_round` complete DFS replicas (round robin) and drop
        the replicas whose file vanished (stat answers "no such file" while the DFS directory
        itself is there; any other error keeps the replica); answers how many were dropped."""
        core = self._core
        dropped = 0
        if not self._complete:
            return 0
        try:  # the directory itself: a round is skipped while the storage is not there
            if not stat.S_ISDIR(os.stat(os.path.join(self.root, DFS_DIR)).st_mode):
                return 0
        except OSError:
            return 0
        for _ in range(min(self.per_round, len(self._complete))):
            offset, obj = self._complete.popitem(last=False)
            replica = next(
                (r for r in obj.replicas if r.segment is self.segment and r.offset == offset),
                None,
            )
            if replica is None or core.index.get(obj.tenant, obj.key) is not obj:
                continue  # gone another way (its free removed the file)
            try:
                os.stat(dfs_file(self.root, offset))
            except FileNotFoundError:
                pass  # vanished: dropped below
            except OSError:  # a passing storage error says nothing about the file
                self._complete[offset] = obj
                continue
            else:
                self._complete[offset] = obj  # back at the end of the round
                continue
            self.drop_vanished(obj, replica)
            dropped += 1
        return dropped

    def drop_vanished(self, obj: ObjectMeta, replica: Replica) -> None:
        """`replica`'s file is gone: the replica goes (the object with it when it was its last
        readable one; a reader would only get errors from it)."""
        self._complete.pop(replica.offset, None)
        self.counters["vanished"] += 1
        log.warning(
            "DFS: the file of %r (%x) vanished; its replica is dropped", obj.key, replica.offset
        )
        self._core.drop_replica(obj, replica)


def _file_id(name: str) -> int | None:
    """The file id a DFS directory entry is named after (`<id>` or `<id>.tmp`, 16 hex
    digits: `kvpool.protocol.tiers.dfs_file`); None for any other name (never touched)."""
    base = name.removesuffix(".tmp")
    if len(base) != 16:
        return None
    try:
        file_id = int(base, 16)
    except ValueError:
        return None
    return file_id if f"{file_id:016x}" == base else None  # no sign, "_" or capitals


def _name_root(root: str) -> None:
    """Add `root` to the directory's `DFS_ROOT_FILE` (one root a line, the last `ROOTS_KEPT`:
    HA masters may mount it at different paths; a temporary file, then a rename), so a client
    that mounts it at another path maps the replicas of its masters, and only them, there
    (`kvpool.client.dfs`). Best effort: without it such a client uses the replicas' path."""
    path = os.path.join(root, DFS_ROOT_FILE)
    tmp = f"{path}.{os.getpid()}"
    try:
        try:
            with open(path, encoding="utf-8") as f:
                roots = f.read(ROOTS_FILE_MAX).splitlines()
        except FileNotFoundError:
            roots = []
        if root in roots:
            return
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join([*roots, root][-ROOTS_KEPT:]) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("DFS: cannot name the root in %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
