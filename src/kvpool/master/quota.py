"""Tenant quotas: the policy file, and the admission rule the put paths apply.

`kvpool master --tenant-quota-file policy.yaml` (or Mooncake's `--enable_multi_tenants
--tenant_quota_connector_type=file --tenant_quota_connector_uri=policy.yaml`) names a file in
Mooncake's format::

    version: 1
    tenants:
      - {name: team-a, quota: 64GiB}     # bytes: an int, or a size string
      - {name: team-b, quota: 1099511627776}

What is counted: the bytes of a tenant's indexed objects (`ObjectIndex.tenant_bytes`, kept at
the index's own insert and discard, so usage equals the sum of the live objects' sizes by
construction). A put is charged when it is admitted (PutStart, UpsertStart, PutCommit from an
arena: the object is indexed, PROCESSING, from then on) and refunded when its object leaves the
index for any reason (revoke, a failed or preempted write, remove, eviction, a lost segment).
Replicas are not multiplied in: a quota bounds a tenant's logical bytes, so copy, move and
repair targets and a promotion from a disk tier (a new replica of an object already counted)
charge nothing, and their failure refunds nothing; the pool's replication policy is not the
tenant's spending. A put that would take its tenant past its quota first evicts that
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
