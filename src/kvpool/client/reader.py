"""`Reader`: the Store's get paths, one value or a batch, and the batch's mapped fast path.

One value (`get`, `get_into`)
    GetReplicaList grants a read lease and names the replicas → the first COMPLETE memory
    replica on this host is read, else the first complete one; a replica whose read fails (or
    whose bytes fail the checksum) is skipped for the next → the xxh3_64 recorded at PutEnd is
    verified (CHECKSUM_MISMATCH; `verify_checksum=False` turns it off) → a read that finished
    after its lease expired is refused (LEASE_EXPIRED).

A batch (`batch_get`, `batch_get_into`)
    One BatchGetLocations (the compact form of BatchGetReplicaList: parallel lists, no Struct
    per key) and one copy loop for all first choices (`DataPath.move_many`); a key whose first
    choice failed is retried one by one through its other replicas (`read`). The answer's
    lengths, sizes, segment indexes and offsets are checked: what does not fit is RPC_FAIL.

The mapped fast path (`batch_get`)
    A batch whose keys are all found or missing, one replica each, all on one segment mapped
    here (this process's own or a same-host peer's shared memory) is read in one loop under one
    hold of the mapping: each value is copied straight into its new bytearray (no zero-filling
    first) and hashed while it is still in the CPU cache. Anything off that case (or a bad
    checksum, or a late lease) goes to the general path, which does the whole batch again and
    names the failing key.

Remembered locations (`Store(read_mode="cached")`, `kvpool.client.locations`)
    With `locations`, a get first looks the key up there: a place remembered less than its
    TTL ago is read directly (no GetReplicaList, no lease) and the bytes copied are checked
    against the remembered checksum; only a match is returned. A miss, a mismatch (the range
    was freed and reused: a torn read), a vanished segment or a transfer error forgets the
    entry and takes the strict path above, which remembers the replica it read (a disk-tier
    or DFS replica too: read again from its file, or with one transfer from its node). A batch reads
    its remembered keys in one copy loop and asks the master (one BatchGetLocations) only for
    the rest. What this mode may return that strict mode would not is in
    `kvpool.client.locations`.

Values are copied once, straight between segment memory and the caller's (or the result's)
memory. The inputs are checked by the Store (`kvpool.client.validation`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import xxhash

from kvpool.client import dfs
from kvpool.client.datapath import DataPath
from kvpool.client.disk_files import DiskFiles
from kvpool.client.hotcache import HotCache
from kvpool.client.locations import Locations, Remembered, segment_places
from kvpool.client.node import NodeRuntime
from kvpool.client.places import first_places, replica_list
from kvpool.client.replica import (
    digest_or_checksum,
    lease_deadline,
    order_replicas,
    verify_checksum,
    verify_lease,
)
from kvpool.client.sharedcopy import CHUNKED_MIN, SHARED_MIN
from kvpool.client.validation import check_count
from kvpool.codes import OBJECT_NOT_FOUND
from kvpool.errors import (
    ChecksumMismatch,
    ErrorCode,
    InvalidParams,
    KVPoolError,
    RpcError,
    TransferError,
    error_for_code,
    raise_for_code,
)
from kvpool.protocol.messages import (
    BatchGetLocations,
    GetReplicaList,
    LocationsReply,
    ReplicaDesc,
    ReplicaKind,
    ReplicaListReply,
    ReplicaStatus,
    ReportBadReplica,
    SegmentName,
    TenantId,
)
from kvpool.protocol.tiers import DFS_SEGMENT
from kvpool.transfer.native import MIN_BYTES, copy_xxh3, new_bytearray, read_new
from kvpool.transfer.request import TransferOp, TransferRequest

__all__ = ["Reader"]

log = logging.getLogger(__name__)

_DIRECT_MAX = SHARED_MIN
"""A cached `get` of a value below this many bytes on a mapped segment copies it into its new
bytearray in one go (no zero-filling first), then hashes it; larger ones go through
`DataPath.copy_hashing`, where the copy helper thread can take part. (An A/B with
`benchmarks/fast_paths.py --ab`: docs/parts/perf-store.md.)"""

_ABSENT = frozenset({ErrorCode.OBJECT_NOT_FOUND, ErrorCode.REPLICA_IS_NOT_READY})
"""What `batch_get` answers None for: no readable value (yet). Other failures raise."""


class Reader:
    """The get paths of one Store (module docstring). Thread-safe: it keeps no state of its own
    between calls; `opened` answers the Store's `DataPath`, or raises `StoreClosed`; `verify`
    checks every read against the checksum recorded at PutEnd (`Store.verify_checksum`)."""

    __slots__ = ("_disk", "_node", "_opened", "hot", "locations", "tenant", "verify")

    def __init__(
        self,
        node: NodeRuntime,
        opened: Callable[[], DataPath],
        tenant: TenantId,
        verify: bool,
        locations: Locations | None = None,
    ) -> None:
        self._node = node
        self._opened = opened
        self.tenant = tenant
        self.verify = verify
        self.locations = locations
        #: The hot cache of remote values (cached mode with `hot_cache_size`), or None.
        self.hot: HotCache | None = None
        self._disk = DiskFiles(node.host_id)
        """Disk-tier files of this host, read with preadv (`kvpool.client.disk_files`)."""

    def close(self) -> None:
        """Close the disk-tier files this reader opened (idempotent)."""
        self._disk.close()

    # ------------------------------------------------------------------ one value

    def get(self, key: str) -> bytearray:
        """The value of `key` in a bytearray allocated once for it; raises `ObjectNotFound`."""
        data = self._opened()
        locations = self.locations
        epoch = 0
        if locations is not None:
            hot = self.hot
            if hot is not None:
                cached = self._hot_get(locations, hot, key)
                if cached is not None:
                    return bytearray(cached)
                epoch = hot.epoch
            entry = locations.lookup(key)
            if entry is not None:
                got = self._get_remembered(data, key, entry)
                if got is not None:
                    if hot is not None:
                        self._offer(data, hot, key, entry.segment, got, epoch=epoch)
                    return got
            epoch = locations.epoch
        hot_epoch = self.hot.epoch if self.hot is not None else 0
        started = time.monotonic()
        rl = self._node.rpc.call_as(GetReplicaList(key, self.tenant), ReplicaListReply)
        if rl.code:
            raise_for_code(rl.code, key)
        # Not zero-filled first when the read is verified: returned only once it all matched.
        verified = self.verify and rl.checksum is not None
        out = new_bytearray(rl.size) if verified else bytearray(rl.size)
        ttl = rl.lease_ttl_ms  # lease_deadline, inline
        deadline = started + ttl / 1000.0 if ttl > 0 else float("inf")
        done = self.read(key, rl, memoryview(out), deadline)
        if locations is not None:
            self._remember(key, rl, done, epoch)
        if self.hot is not None:
            self._offer(data, self.hot, key, done.segment, out, epoch=hot_epoch)
        return out

    def get_into(self, key: str, mv: memoryview) -> int:
        """Read `key` into `mv`; returns the value's size. A buffer smaller than the value is
        INVALID_PARAMS and nothing is read."""
        locations = self.locations
        epoch = 0
        if locations is not None:
            hot = self.hot
            if hot is not None:
                cached = self._hot_get(locations, hot, key)
                if cached is not None and len(cached) <= mv.nbytes:
                    mv[: len(cached)] = cached
                    return len(cached)
                epoch = hot.epoch
            entry = locations.lookup(key)
            if entry is not None and entry.size <= mv.nbytes:
                data = self._opened()
                dest = mv[: entry.size]
                if self._read_remembered(data, key, entry, dest):
                    if hot is not None:
                        self._offer(data, hot, key, entry.segment, dest, epoch=epoch)
                    return entry.size
            epoch = locations.epoch
        started = time.monotonic()
        rl = self._node.rpc.call_as(GetReplicaList(key, self.tenant), ReplicaListReply)
        if rl.code:
            raise_for_code(rl.code, key)
        if rl.size > mv.nbytes:
            raise InvalidParams(f"{key!r}: buffer of {mv.nbytes} bytes for a {rl.size}-byte value")
        ttl = rl.lease_ttl_ms  # lease_deadline, inline
        deadline = started + ttl / 1000.0 if ttl > 0 else float("inf")
        done = self.read(key, rl, mv if mv.nbytes == rl.size else mv[: rl.size], deadline)
        if locations is not None:
            self._remember(key, rl, done, epoch)
        return rl.size

    # ------------------------------------------------------------------ the hot cache

    @staticmethod
    def _hot_get(locations: Locations, hot: HotCache, key: str) -> bytes | None:
        if locations.refresh is not None:
            locations.refresh()  # the pushes that arrived first
        return hot.get(key)

    @staticmethod
    def _offer(
        data: DataPath,
        hot: HotCache,
        key: str,
        segment: str,
        value: bytearray | memoryview,
        *,
        epoch: int,
    ) -> None:
        """Offer a value just read to the hot cache, when it came over TCP (a replica on
        another host, or TCP forced; `kvpool.client.hotcache`); a DFS file is read here."""
        if segment != DFS_SEGMENT and data.over_tcp(segment):
            hot.offer(key, value, epoch)

    # ------------------------------------------------------------------ remembered places

    def _get_remembered(self, data: DataPath, key: str, entry: Remembered) -> bytearray | None:
        """`get` from a remembered place: the value, or None (the entry is forgotten) when
        the place no longer holds it. A value below `_DIRECT_MAX` on a segment mapped here is
        copied straight into its new bytearray (no zero-filling first) and hashed as it is
        copied (`kvpool.transfer.native`; else just after)."""
        size = entry.size
        if size < _DIRECT_MAX and entry.replica is None:
            hold = data.hold_mapped(entry.segment)
            if hold is not None:
                off = entry.offset
                with hold:
                    mem = hold.buffer
                    if off >= 0 and off + size <= mem.nbytes:
                        if copy_xxh3 is not None and size >= MIN_BYTES:
                            buf, digest = read_new(hold.address + off, size)
                        else:
                            buf = bytearray(mem[off : off + size])
                            digest = xxhash.xxh3_64_intdigest(buf)
                        if digest == entry.checksum:
                            return buf
                self._forget(key)
                return None
        out = new_bytearray(size)  # returned only once a full copy matched the checksum
        return out if self._read_remembered(data, key, entry, memoryview(out)) else None

    def _read_remembered(
        self, data: DataPath, key: str, entry: Remembered, dest: memoryview
    ) -> bool:
        """Copy the remembered place of `key` into `dest` (its size) and check the checksum;
        False (the entry forgotten) when anything failed: the caller asks the master."""
        seg, off = entry.segment, entry.offset
        try:
            digest: int | None = None
            tier = None if entry.replica is None else self._read_file(dest, entry.replica, True)
            if tier is not None:
                code, digest = tier
            elif dest.nbytes < CHUNKED_MIN:
                got, digests = data.move_many(TransferOp.READ, [dest], [seg], [off], True)
                code, digest = got[0], digests[0]
            else:
                done = data.copy_hashing(TransferOp.READ, dest, seg, off)
                if done is None:
                    code = data.transfer([TransferRequest(TransferOp.READ, dest, seg, off)])[0]
                else:
                    code, digest = done
        except KVPoolError as exc:
            log.debug("remembered place of %r on %s: %s", key, seg, exc)
            code = ErrorCode.TRANSFER_FAIL
        if code == ErrorCode.OK and digest_or_checksum(digest, dest) == entry.checksum:
            return True
        self._forget(key)
        return False

    def _forget(self, key: str) -> None:
        if self.locations is not None:
            self.locations.forget(key)

    def _remember(
        self, key: str, rl: ReplicaListReply, done: ReplicaDesc | None, epoch: int
    ) -> None:
        """Remember the replica a strict read of `key` succeeded on (cached mode; a disk-tier
        or DFS one with its description, read from its file next time), unless something was
        forgotten since `epoch` (read before the request left)."""
        locations = self.locations
        if locations is not None and done is not None and rl.checksum is not None:
            tier = None if done.kind == ReplicaKind.MEMORY else done
            locations.remember(
                key, done.segment, done.offset, rl.size, rl.checksum, epoch=epoch, replica=tier
            )

    def read(
        self,
        key: str,
        rl: ReplicaListReply,
        dest: memoryview,
        deadline: float,
        order: list[ReplicaDesc] | None = None,
    ) -> ReplicaDesc:
        """Read the object of `rl` into `dest`, trying the replicas of `order` (default: all
        of them, best first; see the module docstring); returns the replica read, raises the
        last replica's failure."""
        if order is None and len(rl.replicas) == 1 and dest.nbytes < CHUNKED_MIN:
            # The common case in one go: one small memory replica on a segment mapped here.
            r = rl.replicas[0]
            verify = self.verify and rl.checksum is not None
            if r.kind == ReplicaKind.MEMORY and r.status == ReplicaStatus.COMPLETE:
                done = self._opened().read_mapped(dest, r.segment, r.offset, verify)
                if done is not None and done[0] == ErrorCode.OK:
                    if verify and done[1] != rl.checksum:
                        self._report_bad(key, r.segment, r.offset)
                        verify_checksum(key, dest, rl.checksum, done[1])  # raises
                    if time.monotonic() > deadline:
                        verify_lease(key, deadline)  # raises
                    return r
            # Anything else (not mapped, a failed copy): the general path below, as before.
        if order is None:
            order = order_replicas(rl.replicas, self._opened().is_local)
        if not order:
            raise error_for_code(ErrorCode.REPLICA_IS_NOT_READY, f"{key!r}: no readable replica")
        failure: KVPoolError | None = None
        verify = self.verify and rl.checksum is not None
        for r in order:
            done = None if r.kind == ReplicaKind.MEMORY else self._read_file(dest, r, verify)
            if done is not None:
                pass
            elif verify and dest.nbytes >= CHUNKED_MIN:
                done = self._opened().copy_hashing(TransferOp.READ, dest, r.segment, r.offset)
            elif dest.nbytes < CHUNKED_MIN:  # copied here when mapped, hashed while in cache
                got, digests = self._opened().move_many(
                    TransferOp.READ, [dest], [r.segment], [r.offset], verify
                )
                done = got[0], digests[0]
            if done is not None:
                code, digest = done
            else:
                req = TransferRequest(TransferOp.READ, dest, r.segment, r.offset)
                code, digest = self._opened().transfer([req])[0], None
            if code != ErrorCode.OK:
                failure = error_for_code(code, f"{key!r}: reading replica on {r.segment} failed")
                if r.kind == ReplicaKind.DFS and code == ErrorCode.OBJECT_NOT_FOUND:
                    self._report_bad(key, r.segment, r.offset)  # its file vanished
                continue
            if verify:
                try:
                    verify_checksum(key, dest, rl.checksum, digest)
                except ChecksumMismatch as exc:
                    failure = exc
                    self._report_bad(key, r.segment, r.offset)
                    continue
            verify_lease(key, deadline)
            return r
        raise failure or TransferError(f"{key!r}: every replica failed")

    def _read_file(
        self, dest: memoryview, r: ReplicaDesc, verify: bool
    ) -> tuple[ErrorCode, int | None] | None:
        """A DFS replica, or a disk-tier replica on this host, read from its file; None when
        it cannot be read that way (the caller copies it from the segment: another host, TCP
        forced, not resolvable)."""
        if r.kind == ReplicaKind.DFS:
            return dfs.read(r, dest, verify)
        if r.kind != ReplicaKind.LOCAL_DISK:
            return None
        data = self._opened()
        if data.protocol == "tcp":
            return None
        try:
            location = data.resolve(r.segment)
        except KVPoolError:
            return None
        return self._disk.read(dest, location, r.offset, verify)

    # ------------------------------------------------------------------ batches

    def batch_get(
        self, ks: list[str], codes: list[ErrorCode] | None = None
    ) -> list[bytearray | None]:
        """The values of `ks`, None for each key without a readable value (missing, or still
        being written). Any other per-key failure (transfer, checksum, lease) raises once the
        whole batch is done, unless `codes` (an empty list) is given: then nothing raises for
        one key, the key answers None and each key's outcome is appended to `codes` (OK,
        OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, TRANSFER_FAIL, CHECKSUM_MISMATCH, ...)."""
        data = self._opened()
        if not ks:
            return []
        if self.locations is not None:
            return self._batch_get_cached(data, self.locations, ks, codes)
        return self._batch_get_strict(ks, codes)

    def _batch_get_cached(
        self,
        data: DataPath,
        locations: Locations,
        ks: list[str],
        codes: list[ErrorCode] | None,
    ) -> list[bytearray | None]:
        """`batch_get` in cached mode: the remembered keys read and checked here, the rest
        (and any whose check failed) through the strict path, in one BatchGetLocations."""
        entries = locations.lookup_many(ks)
        out = self._read_remembered_batch(data, ks, entries)
        ok = ErrorCode.OK
        rest = [i for i, v in enumerate(out) if v is None]
        if not rest:
            if codes is not None:
                codes.extend([ok] * len(ks))
            return out
        sub_codes: list[ErrorCode] | None = None if codes is None else []
        got = self._batch_get_strict([ks[i] for i in rest], sub_codes)
        for i, v in zip(rest, got, strict=True):
            out[i] = v
        if codes is not None and sub_codes is not None:
            merged = [ok] * len(ks)
            for i, c in zip(rest, sub_codes, strict=True):
                merged[i] = c
            codes.extend(merged)
        return out

    def _read_remembered_batch(
        self, data: DataPath, ks: list[str], entries: list[Remembered | None]
    ) -> list[bytearray | None]:
        """The values of the keys with a remembered place whose bytes pass their checksum;
        None for the others (their entries forgotten when the check failed). The common case,
        every place on one segment mapped here, is one loop under one hold of the mapping."""
        out: list[bytearray | None] = [None] * len(ks)
        if self.locations is not None and self.locations.files:
            entries = segment_places(entries)
        hits = [i for i, e in enumerate(entries) if e is not None]
        if not hits:
            return out
        digest = xxhash.xxh3_64_intdigest
        bad: list[str] = []
        first = entries[hits[0]]
        assert first is not None
        hold = None
        if all(e is None or e.segment == first.segment for e in entries):
            hold = data.hold_mapped(first.segment)
        if hold is not None:
            with hold:
                mem = hold.buffer
                cap = mem.nbytes
                for i in hits:
                    e = entries[i]
                    assert e is not None
                    off = e.offset
                    end = off + e.size
                    if off < 0 or end > cap:
                        bad.append(ks[i])
                        continue
                    buf = bytearray(mem[off:end])
                    if digest(buf) == e.checksum:
                        out[i] = buf
                    else:
                        bad.append(ks[i])
        else:
            bufs = [bytearray(entries[i].size) for i in hits]  # type: ignore[union-attr]
            views = [memoryview(b) for b in bufs]
            try:
                done, digests = data.move_many(
                    TransferOp.READ,
                    views,
                    [entries[i].segment for i in hits],  # type: ignore[union-attr]
                    [entries[i].offset for i in hits],  # type: ignore[union-attr]
                    True,
                )
            except KVPoolError as exc:
                log.debug("remembered places of a batch: %s", exc)
                done, digests = [ErrorCode.TRANSFER_FAIL] * len(hits), [None] * len(hits)
            for i, code, taken, buf, view in zip(hits, done, digests, bufs, views, strict=True):
                e = entries[i]
                assert e is not None
                if code == ErrorCode.OK and digest_or_checksum(taken, view) == e.checksum:
                    out[i] = buf
                else:
                    bad.append(ks[i])
        if bad and self.locations is not None:
            self.locations.forget_many(bad)
        return out

    def _batch_get_strict(
        self, ks: list[str], codes: list[ErrorCode] | None
    ) -> list[bytearray | None]:
        """`batch_get` through the master (strict mode; cached mode's misses)."""
        epoch = self.locations.epoch if self.locations is not None else 0
        started = time.monotonic()
        loc = self._locations(ks)
        fast = self._batch_get_mapped(loc, started)
        if fast is not None:
            if codes is not None:
                codes.extend(ErrorCode.of(c) if c else ErrorCode.OK for c in loc.codes)
            if self.locations is not None:
                self._remember_batch(ks, loc, [v is not None for v in fast], None, epoch)
            return fast
        out: list[bytearray | None] = []
        dests: list[memoryview | None] = []
        for code, size in zip(loc.codes, loc.sizes, strict=True):
            if code == 0:
                buf = bytearray(size)
                out.append(buf)
                dests.append(memoryview(buf))
            else:
                out.append(None)
                dests.append(None)
        firsts: list[bool] | None = None if self.locations is None else [False] * len(ks)
        got = self._read_batch(ks, loc, dests, started, firsts)
        first: KVPoolError | None = None
        for i, code in enumerate(got):
            if code != ErrorCode.OK:
                out[i] = None
                if code not in _ABSENT and first is None:
                    first = error_for_code(code, f"{ks[i]!r}")
        if firsts is not None:
            first_of = first_places(loc, self._opened().is_local)
            self._remember_batch(ks, loc, firsts, first_of, epoch)
        if codes is not None:
            codes.extend(got)
        elif first is not None:
            raise first
        return out

    def batch_get_into(self, ks: list[str], views: list[memoryview]) -> list[int]:
        """Read each key into its view; per key the bytes read, or a negative `ErrorCode`
        value (OBJECT_NOT_FOUND, INVALID_PARAMS for a buffer too small, ...)."""
        if not ks:
            return []
        locations = self.locations
        if locations is None:
            return self._batch_get_into_strict(ks, views)
        data = self._opened()
        entries = locations.lookup_many(ks)
        if locations.files:
            entries = segment_places(entries)
        out = [0] * len(ks)
        hits = [i for i, e in enumerate(entries) if e is not None and e.size <= views[i].nbytes]
        rest: list[int] = [
            i for i, e in enumerate(entries) if e is None or e.size > views[i].nbytes
        ]
        if hits:
            dests = [views[i][: entries[i].size] for i in hits]  # type: ignore[union-attr]
            try:
                done, digests = data.move_many(
                    TransferOp.READ,
                    dests,
                    [entries[i].segment for i in hits],  # type: ignore[union-attr]
                    [entries[i].offset for i in hits],  # type: ignore[union-attr]
                    True,
                )
            except KVPoolError as exc:
                log.debug("remembered places of a batch: %s", exc)
                done, digests = [ErrorCode.TRANSFER_FAIL] * len(hits), [None] * len(hits)
            bad: list[str] = []
            for i, code, taken, dest in zip(hits, done, digests, dests, strict=True):
                e = entries[i]
                assert e is not None
                if code == ErrorCode.OK and digest_or_checksum(taken, dest) == e.checksum:
                    out[i] = e.size
                else:
                    bad.append(ks[i])
                    rest.append(i)
            locations.forget_many(bad)
            rest.sort()
        if rest:
            got = self._batch_get_into_strict([ks[i] for i in rest], [views[i] for i in rest])
            for i, n in zip(rest, got, strict=True):
                out[i] = n
        return out

    def _batch_get_into_strict(self, ks: list[str], views: list[memoryview]) -> list[int]:
        epoch = self.locations.epoch if self.locations is not None else 0
        started = time.monotonic()
        loc = self._locations(ks)
        if self.locations is None:  # strict: the common case in one loop, when it is one
            fast = self._opened().read_batch_mapped(loc, views, self.verify)
            if fast is not None and time.monotonic() <= lease_deadline(started, loc.lease_ttl_ms):
                return fast
        sizes = loc.sizes
        dests: list[memoryview | None] = [None] * len(ks)
        early: dict[int, ErrorCode] = {}
        for i, code in enumerate(loc.codes):
            if code != 0:
                continue
            if sizes[i] > views[i].nbytes:
                early[i] = ErrorCode.INVALID_PARAMS
            else:
                dests[i] = views[i][: sizes[i]]
        firsts: list[bool] | None = None if self.locations is None else [False] * len(ks)
        codes = self._read_batch(ks, loc, dests, started, firsts)
        if firsts is not None:
            first_of = first_places(loc, self._opened().is_local)
            self._remember_batch(ks, loc, firsts, first_of, epoch)
        out: list[int] = []
        for i, code in enumerate(codes):
            final = early.get(i, code)
            out.append(sizes[i] if final == ErrorCode.OK else int(final))
        return out

    def _batch_get_mapped(
        self, loc: LocationsReply, started: float
    ) -> list[bytearray | None] | None:
        """`batch_get`'s fast path, for its common case: every key found or missing, each with
        one replica, all on one segment mapped here. One loop under one hold of the mapping:
        each value is copied straight into its new bytearray (no zero-filling first) and
        hashed while it is still in the cache. None when anything is off the common case (the
        general path then does the whole batch, reads again included)."""
        if len(loc.segments) != 1:
            return None
        hold = self._opened().hold_mapped(loc.segments[0])
        if hold is None:
            return None
        digest = xxhash.xxh3_64_intdigest
        verify = self.verify
        sums, sizes, places = loc.checksums, loc.sizes, loc.places
        out: list[bytearray | None] = []
        with hold:
            mem = hold.buffer
            cap = mem.nbytes
            for i, code in enumerate(loc.codes):
                if code:
                    if code != OBJECT_NOT_FOUND:
                        return None
                    out.append(None)
                    continue
                p = places[i]
                if len(p) != 2 or p[0] != 0:
                    return None
                off = p[1]
                end = off + sizes[i]
                if off < 0 or end > cap or end < off:
                    return None  # a malformed answer: the general path reports it
                buf = bytearray(mem[off:end])
                want = sums[i]
                if verify and want is not None and digest(buf) != want:
                    return None  # the general path tells which key and why
                out.append(buf)
        if time.monotonic() > lease_deadline(started, loc.lease_ttl_ms):
            return None
        return out

    def _locations(self, keys: list[str]) -> LocationsReply:
        loc = self._node.rpc.call_as(BatchGetLocations(keys, self.tenant), LocationsReply)
        n = len(keys)
        check_count("BatchGetLocations", len(loc.codes), n)
        if not len(loc.sizes) == len(loc.checksums) == len(loc.places) == n:
            raise RpcError(f"BatchGetLocations: lists of other lengths than {n} keys")
        if len(loc.endpoints) != len(loc.segments):
            raise RpcError("BatchGetLocations: segments and endpoints differ")
        # What the loops index without checking: sizes (buffers are made from them) and the
        # (segment, offset) pairs of places. Offsets and segment indexes are checked where used.
        if (n and min(loc.sizes) < 0) or any(len(p) & 1 for p in loc.places):
            raise RpcError("BatchGetLocations: malformed sizes or places")
        return loc

    def _read_batch(
        self,
        keys: list[str],
        loc: LocationsReply,
        dests: list[memoryview | None],
        started: float,
        firsts: list[bool] | None = None,
    ) -> list[ErrorCode]:
        """Read every key that has a destination: first choices in one batch, then the keys
        whose first choice failed one by one through their other replicas.

        This loop runs once per key of every batch, so it stays plain: codes are converted
        only when not OK, the clock is read once for the whole batch, and the parallel lists
        of the `LocationsReply` are read as they came (no object per key).
        """
        ok = ErrorCode.OK
        data = self._opened()
        segments = loc.segments
        n_segs = len(segments)
        first_of = first_places(loc, data.is_local)
        codes = [ok] * len(dests)
        places: list[memoryview] = []
        segs: list[str] = []
        offs: list[int] = []
        owner: list[int] = []
        bad_place = False
        for i, code in enumerate(loc.codes):
            if code != 0:
                codes[i] = ErrorCode.of(code)
                continue
            dest = dests[i]
            if dest is None:
                codes[i] = ErrorCode.INVALID_PARAMS  # a size check refused it
                continue
            p = loc.places[i]
            if not p:
                codes[i] = ErrorCode.REPLICA_IS_NOT_READY
                continue
            j = first_of[i] if first_of else 0
            seg = p[j]
            if not 0 <= seg < n_segs or p[j + 1] < 0:
                bad_place = True
                codes[i] = ErrorCode.RPC_FAIL
                continue
            places.append(dest)
            segs.append(segments[seg])
            offs.append(p[j + 1])
            owner.append(i)
        if bad_place:
            log.warning("BatchGetLocations named a segment index out of range")
        verify = self.verify
        done, digests = data.move_many(TransferOp.READ, places, segs, offs, verify)
        deadline = lease_deadline(started, loc.lease_ttl_ms)
        late = time.monotonic() > deadline  # one clock read for the whole batch
        sums = loc.checksums
        for i, code, taken, dest, seg_name, off in zip(
            owner, done, digests, places, segs, offs, strict=True
        ):
            want = sums[i]
            if code == ok and (
                not verify or want is None or digest_or_checksum(taken, dest) == want
            ):
                if late:
                    codes[i] = ErrorCode.LEASE_EXPIRED  # late on every replica: final
                elif firsts is not None:
                    firsts[i] = True  # read from its first choice: worth remembering
                continue
            if code == ok:
                codes[i] = ErrorCode.CHECKSUM_MISMATCH
                self._report_bad(keys[i], SegmentName(seg_name), off)
            else:
                codes[i] = code
            # The rare path: the first choice failed; try the others one by one.
            others = replica_list(loc, i, skip=first_of[i] if first_of else 0)
            if others.replicas:
                try:
                    self.read(keys[i], others, dest, deadline, others.replicas)
                    codes[i] = ok
                except KVPoolError as exc:
                    codes[i] = exc.code
        return codes

    def _remember_batch(
        self,
        ks: list[str],
        loc: LocationsReply,
        firsts: list[bool],
        first_of: list[int] | None,
        epoch: int,
    ) -> None:
        """Remember, in cached mode, the first-choice place of every key read from it (not
        when something was forgotten since `epoch`, read before the request left)."""
        locations = self.locations
        if locations is None:
            return
        segments, places, sizes, sums = loc.segments, loc.places, loc.sizes, loc.checksums
        disk = set(loc.disk_segments)
        keys: list[str] = []
        where: list[tuple[str, int, int, int]] = []
        for i, read in enumerate(firsts):
            csum = sums[i]
            if not read or csum is None:
                continue
            j = first_of[i] if first_of else 0
            p = places[i]
            if j + 1 >= len(p) or p[j] in disk or not 0 <= p[j] < len(segments):
                continue
            keys.append(ks[i])
            where.append((segments[p[j]], p[j + 1], sizes[i], csum))
        if keys:
            locations.remember_many(keys, where, epoch)

    def _report_bad(self, key: str, segment: SegmentName, offset: int) -> None:
        """Tell the master that the replica of `key` at `offset` of `segment` failed its
        checksum, so it drops that replica and copies the object again from a good one
        (`ReportBadReplica`). Best effort: the read goes on with the next replica whatever
        the answer, and a failure to report is only logged."""
        try:
            self._node.rpc.call(ReportBadReplica(key, segment, offset, self.tenant))
        except KVPoolError as exc:
            log.debug("reporting a bad replica of %r failed: %s", key, exc)
