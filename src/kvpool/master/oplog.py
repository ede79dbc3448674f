"""The operation log: durable metadata in `--data-dir`, appended before a request is answered.

Files in the data directory, each a header then framed records:

    snapshot-<seq>.kvp   the state when log-<seq> began (complete objects, segments, parks)
    log-<seq>.kvp        every durable change after that snapshot, in order

A file starts with `MAGIC`, a kind byte (`S` snapshot, `L` log) and its sequence number; then
frames, each `<u32 length><u32 crc32>` and a msgpack array of records (`Rec`): all the records
of one request (one flush) in the log, up to `_SNAPSHOT_BATCH` in a snapshot. One frame per
request instead of one per record: a 64-key batch put costs one encode call, one checksum and
one header instead of 128 (docs/parts/perf-ha.md has the numbers). A record describes
*state*, not a call: `ObjRec` is an object's whole durable state (replayed as "set"), `GoneRec`
its removal, `SegRec` / `UnmountRec` a segment's mount and unmount, `FlightRec` a PutStart in
progress (its ranges the writer's until a wall-clock time, unless the key's next record ends
it), `ParkRec` ranges someone may still use until a wall-clock time (a lent arena, a parked
range), `DrainRec` a graceful drain of a segment under way (`drain.py`: a restarted or
promoted master resumes it until its wall-clock end). Replaying set-records is idempotent, so a snapshot followed by the log gives the same
state as the log alone.

Durability: the records of a request are one `os.write` before its reply leaves, so they
survive a kill of the master process (the page cache has them); `fdatasync` runs at most every `fsync_interval`,
so a machine crash loses at most that much. A torn last record (a kill mid-write) is cut off on
load; a bad record followed by good ones is corruption and refused.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import msgspec

from kvpool.errors import InvalidParams
from kvpool.master.metadata import ObjectMeta, Replica
from kvpool.master.segments import Segment
from kvpool.protocol.messages import ReplicaStatus

__all__ = [
    "DrainRec",
    "FlightRec",
    "GoneRec",
    "Journal",
    "ObjRec",
    "OpLog",
    "OpLogCorrupt",
    "ParkRec",
    "Rec",
    "SegRec",
    "UnmountRec",
    "encode_frames",
    "file_header",
    "frames",
    "list_files",
    "obj_rec",
    "read_records",
    "seg_rec",
    "where",
    "write_snapshot",
]

#: Version 2: a frame holds a list of records (version 1, one record per frame, was never
#: released).
MAGIC = b"KVPOOLDM\x02"
_HEAD = struct.Struct("<cQ")  # kind, sequence number
_FRAME = struct.Struct("<II")  # payload length, crc32 of the payload
_MAX_RECORD = 64 << 20
_COMPLETE = ReplicaStatus.COMPLETE

#: (segment name, segment generation, offset) of one replica.
Where = tuple[str, int, int]


class SegRec(msgspec.Struct, array_like=True, tag=1):
    name: str
    generation: int
    size: int
    host_id: str
    endpoint: str
    shm_path: str
    client_id: str
    #: The segment's tier (`ReplicaKind`: 0 memory, 2 a node's disk tier); a field with a
    #: default, at the end: logs written before it still decode (as memory).
    kind: int = 0


class UnmountRec(msgspec.Struct, array_like=True, tag=2):
    name: str
    generation: int


class ObjRec(msgspec.Struct, array_like=True, tag=3):
    tenant: str
    key: str
    size: int
    checksum: int | None
    replica_num: int
    hard_pin: bool
    group_id: str
    soft_pin_ttl: float | None
    #: Wall-clock end of the soft pin (None: none running).
    pin_until: float | None
    replicas: list[Where]


class GoneRec(msgspec.Struct, array_like=True, tag=4):
    tenant: str
    key: str


class ParkRec(msgspec.Struct, array_like=True, tag=5):
    #: Wall-clock time until which a writer may still use the ranges.
    until: float
    size: int
    ranges: list[Where]


class FlightRec(msgspec.Struct, array_like=True, tag=6):
    """A PutStart (or UpsertStart) in progress: its ranges are the writer's until `until`
    (wall clock), unless a later record of the key (its PutEnd, its revoke) ends it."""

    tenant: str
    key: str
    until: float
    size: int
    ranges: list[Where]


class DrainRec(msgspec.Struct, array_like=True, tag=7):
    """A graceful drain of mount (`name`, `generation`) began; it ends at wall-clock `until`
    (its grace of `grace` seconds), or earlier with the segment's unmount (`UnmountRec`)."""

    name: str
    generation: int
    until: float
    grace: float


Rec = SegRec | UnmountRec | ObjRec | GoneRec | ParkRec | FlightRec | DrainRec


class OpLogCorrupt(InvalidParams):
    """A data-dir file is damaged somewhere other than its last record."""


_DECODER = msgspec.msgpack.Decoder(list[Rec])
#: Records per frame in snapshots and snapshot streams.
_SNAPSHOT_BATCH = 1024


def list_files(data_dir: Path, prefix: str) -> list[tuple[int, Path]]:
    """(seq, path) of `prefix-<seq>.kvp` files, by seq."""
    out: list[tuple[int, Path]] = []
    for p in data_dir.glob(f"{prefix}-*.kvp"):
        try:
            out.append((int(p.stem.split("-", 1)[1]), p))
        except ValueError:
            continue
    return sorted(out)


def read_records(path: Path, *, tolerate_tail: bool) -> Iterator[Rec]:
    """Every record of `path`. A damaged last record is dropped (and, with `tolerate_tail`,
    the file truncated before it); damage before good records raises `OpLogCorrupt`."""
    data = path.read_bytes()
    head = len(MAGIC) + _HEAD.size
    if len(data) < head or not data.startswith(MAGIC):
        raise OpLogCorrupt(f"{path}: not a kvpool data file (bad header)")
    dec = _DECODER
    pos = head
    end = len(data)
    while pos < end:
        bad = pos + _FRAME.size > end
        if not bad:
            n, crc = _FRAME.unpack_from(data, pos)
            body = data[pos + _FRAME.size : pos + _FRAME.size + n]
            bad = n > _MAX_RECORD or len(body) != n or zlib.crc32(body) != crc
        if bad:
            if not tolerate_tail or _has_later_record(data, pos + 1):
                raise OpLogCorrupt(f"{path}: corrupt record at byte {pos} (not the last)")
            with path.open("r+b") as f:
                f.truncate(pos)
            return
        yield from dec.decode(body)
        pos += _FRAME.size + n


def _has_later_record(data: bytes, start: int) -> bool:
    """Whether a valid frame starts anywhere after `start` (a bad record in the middle)."""
    for pos in range(start, len(data) - _FRAME.size):
        n, crc = _FRAME.unpack_from(data, pos)
        if 0 < n <= len(data) - pos - _FRAME.size and n <= _MAX_RECORD:
            body = data[pos + _FRAME.size : pos + _FRAME.size + n]
            if zlib.crc32(body) == crc:
                return True
    return False


def frames(data: bytes | memoryview) -> Iterator[Rec]:
    """The records of `data`: whole frames as `OpLog` writes them (a replication stream or a
    snapshot chunk); `OpLogCorrupt` on a bad frame."""
    dec = _DECODER
    pos = 0
    end = len(data)
    view = memoryview(data)
    while pos < end:
        if pos + _FRAME.size > end:
            raise OpLogCorrupt(f"replication stream: torn frame at byte {pos}")
        n, crc = _FRAME.unpack_from(data, pos)
        body = view[pos + _FRAME.size : pos + _FRAME.size + n]
        if len(body) != n or zlib.crc32(body) != crc:
            raise OpLogCorrupt(f"replication stream: corrupt frame at byte {pos}")
        yield from dec.decode(body)
        pos += _FRAME.size + n


class OpLog:
    """Appends records to the current log file; rotates to a new one at each snapshot.

    Without a data directory (`data_dir` None: an HA master without `--data-dir`) nothing is
    written to disk; `tap`, when set, is given the bytes of each flush either way (the
    replication stream of an HA leader, `replication.py`)."""

    def __init__(
        self,
        data_dir: Path | None,
        seq: int,
        fsync_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.data_dir = data_dir
        self.seq = seq
        self._fsync_interval = fsync_interval
        self._clock = clock
        self._enc = msgspec.msgpack.Encoder()
        self._buf = bytearray()
        self._recs: list[Rec] = []
        self._fd = -1
        self._synced = clock()
        self._dirty = False
        #: Records appended since start (for stats and benchmarks).
        self.records = 0
        self.bytes = 0
        #: Given the bytes of every flush (whole frames), after they were written.
        self.tap: Callable[[bytes], None] | None = None
        if data_dir is not None:
            self._open(seq)

    def _open(self, seq: int) -> None:
        assert self.data_dir is not None
        path = self.data_dir / f"log-{seq:08d}.kvp"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if os.fstat(fd).st_size == 0:
            os.write(fd, MAGIC + _HEAD.pack(b"L", seq))
        self._fd = fd
        self.seq = seq

    def append(self, rec: Rec) -> None:
        """Add `rec` to the records of this request; `flush` writes them (before the reply)."""
        self._recs.append(rec)

    def append_frames(self, data: bytes) -> None:
        """Add whole frames encoded elsewhere (a standby logging its leader's stream)."""
        self._buf += data

    def flush(self) -> None:
        """Write what was appended to the OS (one `write`: it survives a kill of this process
        on return); fdatasync too with `fsync_interval` 0. Then hand the bytes to `tap`."""
        buf = self._buf
        recs = self._recs
        if recs:
            body = self._enc.encode(recs)  # one frame for the whole request
            buf += _FRAME.pack(len(body), zlib.crc32(body))
            buf += body
            self.records += len(recs)
            recs.clear()
        if not buf:
            return
        self.bytes += len(buf)
        if self._fd >= 0:
            view = memoryview(buf)
            done = 0
            while done < len(buf):  # a regular file takes it all; a full disk raises
                done += os.write(self._fd, view[done:])
            view.release()
            self._dirty = True
            if self._fsync_interval <= 0:
                os.fdatasync(self._fd)
                self._dirty = False
        if self.tap is not None:
            self.tap(bytes(buf))
        del buf[:]

    def sync_due(self) -> int | None:
        """Write what background work appended; when the last fdatasync is `fsync_interval`
        old and something was written since, answer a duplicate of the log's descriptor for
        the caller to fdatasync (off the loop: `fdatasync_fd`) and count the log synced."""
        self.flush()
        if self._dirty and self._clock() - self._synced >= self._fsync_interval:
            self._dirty = False
            self._synced = self._clock()
            return os.dup(self._fd)  # the log may rotate (close its descriptor) meanwhile
        return None

    def sync(self) -> None:
        if self._fd >= 0:
            self.flush()
        if self._fd >= 0 and self._dirty:
            os.fdatasync(self._fd)
        self._dirty = False
        self._synced = self._clock()

    @staticmethod
    def fdatasync_fd(fd: int) -> None:
        """fdatasync and close a descriptor from `sync_due` (blocks: run it in a thread)."""
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def rotate(self) -> int:
        """Start log-<seq+1> (the records from now on follow the snapshot of seq+1)."""
        self.sync()
        if self._fd < 0:
            self.seq += 1
            return self.seq
        os.close(self._fd)
        self._open(self.seq + 1)
        return self.seq

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1
        else:
            self.flush()
        self.tap = None


def file_header(kind: bytes, seq: int) -> bytes:
    """The header of a data file (`kind` b"S" snapshot, b"L" log)."""
    return MAGIC + _HEAD.pack(kind, seq)


def encode_frames(records: Iterable[Rec], limit: int) -> tuple[bytes, bool]:
    """Frames of `records` (an iterator) until about `limit` bytes; (frames, exhausted). A
    frame holds up to `_SNAPSHOT_BATCH` records, fewer for a small `limit` (records are
    about 70 bytes), so a chunk is never much more than `limit`."""
    enc = msgspec.msgpack.Encoder()
    out = bytearray()
    size = max(1, min(_SNAPSHOT_BATCH, limit // 128))
    for batch in _batches(records, size):
        body = enc.encode(batch)
        out += _FRAME.pack(len(body), zlib.crc32(body))
        out += body
        if len(batch) < size:
            return bytes(out), True
        if len(out) >= limit:
            return bytes(out), False
    return bytes(out), True


def _batches(records: Iterable[Rec], size: int = _SNAPSHOT_BATCH) -> Iterator[list[Rec]]:
    """`records` in lists of `size`; the last one shorter (possibly empty)."""
    it = iter(records)
    while True:
        batch = list(itertools.islice(it, size))
        yield batch
        if len(batch) < size:
            return


def write_snapshot(path: Path, seq: int, records: Iterator[Rec]) -> None:
    """Write a snapshot file atomically (a temporary name, fsync, rename)."""
    enc = msgspec.msgpack.Encoder()
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(MAGIC + _HEAD.pack(b"S", seq))
        for batch in _batches(records):
            if batch:
                body = enc.encode(batch)
                f.write(_FRAME.pack(len(body), zlib.crc32(body)))
                f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Journal:
    """Turns core changes into records (times converted from the master clock to wall time)."""

    __slots__ = ("_clock", "_log", "_wall")

    def __init__(self, oplog: OpLog, clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self._log = oplog
        self._clock = clock
        self._wall = wall

    def to_wall(self, t: float) -> float:
        return t - self._clock() + self._wall()

    def obj(self, obj: ObjectMeta) -> None:
        if obj.complete:
            self._log.append(obj_rec(obj, self.to_wall))

    def gone(self, obj: ObjectMeta) -> None:
        self._log.append(GoneRec(obj.tenant, obj.key))

    def park(self, until: float, size: int, replicas: Iterable[Replica]) -> None:
        self._log.append(ParkRec(self.to_wall(until), size, [where(r) for r in replicas]))

    def flight(self, obj: ObjectMeta, until: float) -> None:
        self._log.append(
            FlightRec(
                obj.tenant, obj.key, self.to_wall(until), obj.size, [where(r) for r in obj.replicas]
            )
        )

    def park_range(self, seg: Segment, off: int, size: int, until: float) -> None:
        self._log.append(ParkRec(self.to_wall(until), size, [(seg.name, seg.generation, off)]))

    def mount(self, seg: Segment) -> None:
        self._log.append(seg_rec(seg))

    def unmount(self, seg: Segment) -> None:
        self._log.append(UnmountRec(seg.name, seg.generation))

    def drain(self, seg: Segment, deadline: float, grace: float) -> None:
        """A drain of `seg` began (written at once: it may start outside any request)."""
        self._log.append(DrainRec(seg.name, seg.generation, self.to_wall(deadline), grace))
        self._log.flush()


def where(r: Replica) -> Where:
    return (r.segment.name, r.segment.generation, r.offset)


def obj_rec(obj: ObjectMeta, to_wall: Callable[[float], float]) -> ObjRec:
    pin = obj.soft_pin_deadline
    return ObjRec(
        obj.tenant,
        obj.key,
        obj.size,
        obj.checksum,
        obj.replica_num,
        obj.hard_pin,
        obj.group_id,
        obj.soft_pin_ttl,
        None if pin is None else to_wall(pin),
        [where(r) for r in obj.replicas if r.status is _COMPLETE],
    )


def seg_rec(seg: Segment) -> SegRec:
    return SegRec(
        seg.name,
        seg.generation,
        seg.size,
        seg.host_id,
        seg.endpoint,
        seg.shm_path,
        seg.client_id,
        int(seg.kind),
    )
