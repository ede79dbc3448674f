"""Tenant quotas: the policy file, and the admission rule the put paths apply.

`kvpool master --tenant-quota-file policy.yaml` (or Mooncake's `--enable_multi_tenants
--tenant_quota_connector_type=file --tenant_quota_connector_uri=policy.yaml`) names a file in
Mooncake's format::

    version: 1
    tenants:
      - {name: team-a, quota: 64GiB}     # bytes: an int, or a size string
      - {name: team-b, quota: 1099511627776}

What is counted: the space a tenant holds, replica by replica. A tenant's usage
(`ObjectIndex.tenant_bytes`) is the object size once for every replica of its indexed objects,
whatever the replica's kind and status (memory, local disk, DFS; PROCESSING counts from the
moment its range is allocated), plus the targets of its objects' running copy and move tasks
(repair, drain, offload and promotion are such tasks). It is kept where the space changes
hands: the index charges an object's replicas when it is indexed and refunds them when it
leaves (`kvpool.master.metadata`), `MetadataCore._set_replicas` charges or refunds the
difference whenever an indexed object's replicas change (`kvpool.master.core`: an upsert, a
copy or move that lands, a replica dropped, evicted, found bad, or lost with its segment), and
a task's targets are charged from its launch to its end (`kvpool.master.task_table`: on success
they are charged again as the object's replicas). So: a put is charged at PutStart /
UpsertStart for every replica allocated (a PutCommit from an arena for its one replica) and
refunded by revoke, a failed or preempted write, remove, eviction, a lost segment; a move holds
source and target while it runs and the source's charge goes when the target takes its place;
a failed task refunds its targets. Ranges the master keeps parked after their object left (a
reader's lease, a late writer) are charged to no one: the tenant can no longer use them.
O(1) per replica on the write paths (a multiplication at PutStart, one index look-up where an
indexed object's replicas change). A put is admitted when its usage, net of what the object
it replaces holds, plus its size times the replicas it asks for stays within the quota (a DFS
copy asked for is charged when allocated but not counted at admission; Mooncake allows the DFS
tier to the default tenant only). Background work for a tenant at or over its quota: repair
and moves (drain, on-evict moves to disk, CreateMoveTask) proceed, since they restore or keep
what was admitted (a move holds one extra replica only while it runs); a CreateCopyTask whose
targets would take the tenant past its quota is refused TENANT_QUOTA_EXCEEDED
(`kvpool.master.tasks`), and an eager offload or a promotion from a disk tier is skipped
while it would (`kvpool.master.tiers`).
A put that would take its tenant past its quota first evicts that
tenant's own coldest unpinned objects when the master runs reclaim in cache mode
(`kvpool.master.reclaim.tenants`; never the object the put replaces), and otherwise, or when
that is not enough, fails with TENANT_QUOTA_EXCEEDED (-1700) and changes nothing; a put
replacing an object of the same key is counted net of the bytes it replaces. With quotas in
force, reclaim for a full pool keeps the objects of tenants at or below their fair share
while another tenant is above its own (same module). A tenant not in the file has no limit
(its usage is still shown). The file is reloaded on SIGHUP; a lower quota than the usage
refuses new puts until removals (or own evictions) bring the usage under it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from kvpool.config import parse_size
from kvpool.errors import InvalidParams, KVPoolError

__all__ = ["ETCD_SOURCE", "TenantQuotas", "load_quota_file", "load_quota_text"]

#: `--tenant-quota-file etcd`: the policy is the value of `/kvpool/<cluster>/quota` in the HA
#: group's etcd (the same YAML), polled by every master (`kvpool.master.ha`).
ETCD_SOURCE = "etcd"

log = logging.getLogger(__name__)


def load_quota_file(path: str | Path) -> dict[str, int]:
    """The quotas (bytes) of the policy file at `path` (InvalidParams naming the entry)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidParams(f"tenant quota file {path}: {exc}") from exc
    return load_quota_text(text, path)


def load_quota_text(text: str, path: str | Path) -> dict[str, int]:
    """The quotas (bytes) of a policy's YAML `text`; `path` names it in errors."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidParams(f"tenant quota file {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise InvalidParams(f"tenant quota file {path}: expected 'version: 1'")
    entries = doc.get("tenants")
    if not isinstance(entries, list):
        raise InvalidParams(f"tenant quota file {path}: expected a list under 'tenants:'")
    out: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"tenant quota file {path}, tenants[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "quota"}:
            raise InvalidParams(f"{where}: expected {{name, quota}}")
        name = entry["name"]
        if not isinstance(name, str) or not name or len(name) > 256:
            raise InvalidParams(f"{where}: 'name' must be a non-empty string")
        if name in out:
            raise InvalidParams(f"{where}: tenant {name!r} is listed twice")
        quota = entry["quota"]
        if isinstance(quota, bool) or not isinstance(quota, int | str):
            raise InvalidParams(f"{where}: 'quota' must be bytes (an int or '64GiB')")
        out[name] = parse_size(quota, name=f"{where} quota", maximum=1 << 62)
    return out


class TenantQuotas:
    """The quotas in force (`limit`), reloaded from `path` by `reload`. Loop-owned."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        #: The etcd revision of the policy in force (`ETCD_SOURCE`; -1: none read yet).
        self.revision = -1
        self.limits: dict[str, int] = {} if self.etcd else load_quota_file(self.path)

    @property
    def etcd(self) -> bool:
        """Whether the policy lives in etcd (`ETCD_SOURCE`) rather than in a file."""
        return self.path == ETCD_SOURCE

    def apply(self, text: bytes | None, revision: int, where: str) -> bool:
        """Apply the policy read from etcd at `revision` (None: the key is absent, no quotas);
        a policy that does not load is logged and the quotas in force stay."""
        if revision == self.revision:
            return False
        try:
            limits = {} if text is None else load_quota_text(text.decode(), where)
        except (KVPoolError, UnicodeDecodeError) as exc:
            log.error("tenant quotas in %s not applied, the previous stay: %s", where, exc)
            self.revision = revision  # logged once per revision
            return False
        self.limits = limits
        self.revision = revision
        log.info("tenant quotas from %s (revision %d): %d tenants", where, revision, len(limits))
        return True

    def limit(self, tenant: str) -> int | None:
        """The tenant's quota in bytes, None when it has none."""
        return self.limits.get(tenant)

    def reload(self) -> bool:
        """Load the file again (SIGHUP); on any error keep the quotas in force and log it.
        A policy in etcd is watched instead (nothing to do here)."""
        if self.etcd:
            return False
        try:
            self.limits = load_quota_file(self.path)
        except KVPoolError as exc:
            log.error("tenant quota file not reloaded, the previous quotas stay: %s", exc)
            return False
        log.info("tenant quota file %s reloaded: %d tenants", self.path, len(self.limits))
        return True
