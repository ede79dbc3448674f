"""`mooncake_master`'s command line, read as Mooncake reads it, turned into `kvpool master`'s.

Deployment scripts start Mooncake's master with gflags command lines::

    mooncake_master --rpc_port=50051 --default_kv_lease_ttl=500 --eviction_high_watermark_ratio=0.9

This module knows every flag of Mooncake's master (`FLAGS`: its name, type, Mooncake's default,
what kvpool does with it) and reads such a command line with gflags' rules and Mooncake's
units, then says which `kvpool master` arguments mean the same (`translate`). It runs nothing
and imports neither the master nor the CLI (the compat layer stands on the Store alone); the
`mooncake_master` command (`kvpool.cli.mooncake_master`) feeds the result to `kvpool master`.

gflags' syntax, as accepted here:

* `--flag=value`, `-flag=value`, `--flag value`, `-flag value`;
* booleans: `--flag` (true), `--noflag` (false), `--flag=true|false|1|0|yes|no|t|f|y|n`; a
  boolean never takes the next argument as its value;
* `--flagfile=FILE` reads more flags from FILE, one per line (`#` starts a comment);
* `--` ends the flags; what follows goes to `kvpool master` unchanged (kvpool's own options,
  such as `-- --eviction-mode pool`);
* `--help`, `--helpfull`, `--version`.

Names use underscores, as in Mooncake; an unknown name (`--default-kv-lease-ttl`, a typo) is an
error naming the nearest flag. Units are Mooncake's: the lease and soft-pin TTLs are durations
in milliseconds unless suffixed (`500`, `500ms`, `5s`, `30m`, `1h`), `client_ttl` and every
`*_sec` / `*_seconds` flag are seconds. `--config_path` (JSON, the same keys) is read first;
flags on the command line win over it, as in Mooncake.

Three kinds of flag (`Support`): MAPPED flags change the kvpool master exactly as they change
Mooncake's; NOOP flags are accepted because kvpool has nothing to tune there (thread counts, an
HTTP metadata server it does not need); UNSUPPORTED flags name features kvpool lacks (RDMA-side
tiers, CXL, NVMe-oF, KV events, ...): set to anything but Mooncake's default, each gives one
warning and changes nothing. `flag_table_markdown()` renders `FLAGS` for docs/compat.md (a test
keeps the page equal to it).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from kvpool.errors import InvalidParams

__all__ = [
    "FLAGS",
    "Flag",
    "FlagType",
    "Launch",
    "Parsed",
    "Support",
    "flag_table_markdown",
    "mooncake_etcd_url",
    "parse_argv",
    "parse_duration_ms",
    "translate",
]

DEFAULT_HA_CLUSTER_ID = "mooncake_cluster"
"""Mooncake's cluster id (its `DEFAULT_CLUSTER_ID`): the etcd namespace of an HA pool."""


class FlagType(StrEnum):
    """A flag's type, with Mooncake's units."""

    BOOL = "bool"
    INT = "int"
    UINT = "uint"
    DOUBLE = "double"
    STRING = "string"
    DURATION_MS = "duration (ms)"
    """Milliseconds, or a number with a unit: ms, s, m, h (Mooncake's `ParseDurationMs`)."""
    SECONDS = "int (s)"
    PORT = "int (port)"


class Support(StrEnum):
    """What kvpool does with a flag."""

    MAPPED = "mapped"
    NOOP = "accepted, no effect"
    UNSUPPORTED = "not supported (warning)"


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag of Mooncake's master."""

    name: str
    type: FlagType
    default: str
    """Mooncake's default, as text."""
    support: Support
    kvpool: str
    """What it becomes in kvpool (for MAPPED: the `kvpool master` option; otherwise why)."""


def _f(name: str, type_: FlagType, default: str, support: Support, kvpool: str) -> Flag:
    return Flag(name, type_, default, support, kvpool)


B, INT, U, D, S = FlagType.BOOL, FlagType.INT, FlagType.UINT, FlagType.DOUBLE, FlagType.STRING
MS, SEC, PORT = FlagType.DURATION_MS, FlagType.SECONDS, FlagType.PORT
MAP, NOOP, UNSUP = Support.MAPPED, Support.NOOP, Support.UNSUPPORTED

_TIERS = "kvpool's master has no SSD offload or promotion tier yet"
_NOF = "kvpool has no NVMe-oF segments"
_CXL = "kvpool has no CXL memory segments"
_KV_EVENTS = "kvpool publishes no KV events"
_DYN = "kvpool has no dynamic replica fan-out"
_TENANT = "kvpool has no per-tenant quotas"
_TASKS = "kvpool keeps no task-count limits"
_LOG = "glog flag; kvpool logs to stderr through Python's logging"

FLAGS: tuple[Flag, ...] = (
    # -- where and how it serves
    _f("rpc_port", PORT, "0", MAP, "`--port` (0: use `--port`)"),
    _f("port", PORT, "50051", MAP, "`--port` (deprecated in Mooncake; `--rpc_port` wins)"),
    _f("rpc_address", S, "0.0.0.0", MAP, "`--host`; **kvpool binds 127.0.0.1 unless given**"),
    _f("rpc_interface", S, "", MAP, "`--host` = the interface's IPv4 address"),
    _f("rpc_thread_num", INT, "0", NOOP, "the master is one event loop"),
    _f("max_threads", INT, "16", NOOP, "the master is one event loop"),
    _f("rpc_conn_timeout_seconds", SEC, "0", MAP, "`--rpc-idle-timeout` (0: kvpool's 300 s)"),
    _f("rpc_enable_tcp_no_delay", B, "true", NOOP, "kvpool always sets TCP_NODELAY"),
    _f(
        "cluster_id",
        S,
        DEFAULT_HA_CLUSTER_ID,
        MAP,
        "`--cluster-id` and the cluster of `--ha`, with `--enable_ha` only (else kvpool's `kvpool`)",
    ),
    _f("config_path", S, "", MAP, "a JSON file of these flags; the command line wins"),
    _f("conf_path", S, "", MAP, "old name of `--config_path`"),
    # -- leases, pins, eviction
    _f("default_kv_lease_ttl", MS, "10000", MAP, "`--default-kv-lease-ttl`"),
    _f("default_kv_soft_pin_ttl", MS, "1800000", MAP, "`--default-kv-soft-pin-ttl`"),
    _f("max_kv_soft_pin_ttl", MS, "86400000", MAP, "`--max-kv-soft-pin-ttl`"),
    _f(
        "allow_evict_soft_pinned_objects",
        B,
        "true",
        MAP,
        "`--allow-evict-soft-pinned-objects` / `--no-allow-evict-soft-pinned-objects`",
    ),
    _f("eviction_ratio", D, "0.05", MAP, "`--eviction-ratio`"),
    _f("eviction_high_watermark_ratio", D, "0.9", MAP, "`--eviction-high-watermark-ratio`"),
    _f("client_ttl", SEC, "10", MAP, "`--client-ttl`"),
    _f("put_start_discard_timeout_sec", SEC, "30", MAP, "`--put-start-discard-timeout`"),
    _f("put_start_release_timeout_sec", SEC, "600", MAP, "`--put-start-release-timeout`"),
    _f(
        "allocation_strategy",
        S,
        "random",
        MAP,
        "`--allocation-strategy` (random, free_ratio_first, local_first; cxl and "
        "ssd_free_ratio_first warn and use random)",
    ),
    _f("memory_allocator", S, "offset", MAP, "kvpool's offset allocator (cachelib warns)"),
    _f("enable_gc", B, "false", NOOP, "removed from Mooncake; kvpool frees on remove / eviction"),
    _f("local_hostname", S, "", NOOP, "removed from Mooncake"),
    # -- HA and durable metadata
    _f("enable_ha", B, "false", MAP, "`--ha etcd://ENDPOINTS/CLUSTER_ID`"),
    _f("ha_backend_type", S, "etcd", MAP, "etcd only (redis and k8s are refused)"),
    _f("ha_backend_connstring", S, "", MAP, "the endpoints of `--ha`"),
    _f("etcd_endpoints", S, "", MAP, "the endpoints of `--ha` (`h1:2379;h2:2379`)"),
    _f("enable_oplog", B, "false", NOOP, "kvpool's standbys always follow the leader's log"),
    _f("oplog_poll_interval_ms", INT, "1000", NOOP, "the log is streamed, not polled"),
    _f("oplog_batch_max_entries", U, "1024", NOOP, "the log is streamed, not polled"),
    _f("batch_oplog_retry_timeout_sec", U, "180", NOOP, "the log is streamed, not polled"),
    _f("enable_snapshot", B, "false", MAP, "`--data-dir` (snapshots and an operation log)"),
    _f("enable_snapshot_restore", B, "false", MAP, "`--data-dir` (restored at start)"),
    _f(
        "snapshot_backup_dir",
        S,
        "",
        MAP,
        "`--data-dir` (else `$MOONCAKE_SNAPSHOT_LOCAL_PATH`)",
    ),
    _f("snapshot_interval_seconds", SEC, "600", MAP, "`--snapshot-interval`"),
    _f("snapshot_child_timeout_seconds", SEC, "300", NOOP, "kvpool bounds its snapshot child"),
    _f("snapshot_retention_count", U, "2", NOOP, "kvpool keeps the snapshots it needs"),
    _f("snapshot_object_store_type", S, "", MAP, "local only (s3 warns)"),
    _f("snapshot_payload_store_type", S, "", MAP, "old name of `--snapshot_object_store_type`"),
    _f("snapshot_payload_backend_type", S, "", MAP, "old name of `--snapshot_object_store_type`"),
    _f("snapshot_backend_type", S, "", MAP, "old name of `--snapshot_object_store_type`"),
    _f("snapshot_catalog_store_type", S, "", MAP, "embedded only (redis warns)"),
    _f("snapshot_catalog_backend_type", S, "", MAP, "old name of `--snapshot_catalog_store_type`"),
    _f("snapshot_catalog_store_connstring", S, "", UNSUP, "no external snapshot catalog"),
    _f("snapshot_catalog_backend_connstring", S, "", UNSUP, "no external snapshot catalog"),
    # -- replica tasks
    _f("processing_task_timeout_sec", SEC, "300", MAP, "`--replica-task-timeout` (0: 300 s)"),
    _f("pending_task_timeout_sec", SEC, "300", NOOP, "tasks start at once"),
    _f("max_total_finished_tasks", U, "10000", NOOP, _TASKS),
    _f("max_total_pending_tasks", U, "10000", NOOP, _TASKS),
    _f("max_total_processing_tasks", U, "10000", NOOP, _TASKS),
    _f("max_retry_attempts", U, "10", NOOP, "a failed task is reported, not retried"),
    # -- metrics and the HTTP metadata server
    _f("enable_metric_reporting", B, "true", NOOP, "see `kvpool status`"),
    _f("metrics_port", PORT, "9003", UNSUP, "no HTTP metrics server in the master"),
    _f("metrics_host", S, "0.0.0.0", UNSUP, "no HTTP metrics server in the master"),
    _f("enable_http_metadata_server", B, "false", NOOP, "kvpool needs no metadata server"),
    _f("http_metadata_server_port", PORT, "8080", NOOP, "kvpool needs no metadata server"),
    _f("http_metadata_server_host", S, "0.0.0.0", NOOP, "kvpool needs no metadata server"),
    _f("enable_metadata_cleanup_on_timeout", B, "false", NOOP, "kvpool needs no metadata server"),
    # -- features kvpool does not have
    _f("enable_offload", B, "false", UNSUP, _TIERS),
    _f("offload_on_evict", B, "false", UNSUP, _TIERS),
    _f("offload_force_evict", B, "false", UNSUP, _TIERS),
    _f("offloading_queue_limit", U, "50000", UNSUP, _TIERS),
    _f("offload_cap_ratio", D, "0.5", UNSUP, _TIERS),
    _f("promotion_on_hit", B, "false", UNSUP, _TIERS),
    _f("promotion_admission_threshold", U, "2", UNSUP, _TIERS),
    _f("promotion_queue_limit", U, "50000", UNSUP, _TIERS),
    _f("promotion_max_per_heartbeat", U, "1", UNSUP, _TIERS),
    _f("enable_disk_eviction", B, "true", UNSUP, _TIERS),
    _f("quota_bytes", U, "0", UNSUP, _TIERS),
    _f("root_fs_dir", S, "", MAP, "`--dfs-root` (the DFS tier: `dfs_replica_num=1` puts)"),
    _f("global_file_segment_size", INT, "9223372036854775807", UNSUP, "no DFS replicas"),
    _f("nof_eviction_ratio", D, "0.05", UNSUP, _NOF),
    _f("nof_eviction_high_watermark_ratio", D, "0.9", UNSUP, _NOF),
    _f("nof_heartbeat_interval_sec", SEC, "10", UNSUP, _NOF),
    _f("nof_heartbeat_probe_timeout_ms", U, "1000", UNSUP, _NOF),
    _f("nof_heartbeat_failures_threshold", U, "3", UNSUP, _NOF),
    _f("enable_cxl", B, "false", UNSUP, _CXL),
    _f("cxl_path", S, "/dev/dax0.0", UNSUP, _CXL),
    _f("cxl_size", U, "8589934592", UNSUP, _CXL),
    _f("dynamic_replication_mode", S, "off", UNSUP, _DYN),
    _f("dynamic_replication_heat_window_seconds", SEC, "10", UNSUP, _DYN),
    _f("dynamic_replication_admission_qps_threshold", D, "0.8", UNSUP, _DYN),
    _f("dynamic_replication_max_memory_replicas", U, "2", UNSUP, _DYN),
    _f("enable_kv_events", B, "false", UNSUP, _KV_EVENTS),
    _f("kv_events_bind_endpoint", S, "", UNSUP, _KV_EVENTS),
    _f("kv_events_model_name", S, "", UNSUP, _KV_EVENTS),
    _f("kv_events_backend_id", S, "", UNSUP, _KV_EVENTS),
    _f("kv_events_tenant_id", S, "default", UNSUP, _KV_EVENTS),
    _f("kv_events_additional_salt", S, "", UNSUP, _KV_EVENTS),
    _f("kv_events_lora_name", S, "", UNSUP, _KV_EVENTS),
    _f("kv_events_block_size", U, "0", UNSUP, _KV_EVENTS),
    _f("kv_events_dp_rank", U, "0", UNSUP, _KV_EVENTS),
    _f("kv_events_emit_legacy_compat", B, "true", UNSUP, _KV_EVENTS),
    _f("kv_events_emit_object_key", B, "true", UNSUP, _KV_EVENTS),
    _f("kv_events_queue_capacity", U, "65536", UNSUP, _KV_EVENTS),
    _f("enable_multi_tenants", B, "false", UNSUP, _TENANT),
    _f("tenant_quota_connector_type", S, "file", UNSUP, _TENANT),
    _f("tenant_quota_connector_uri", S, "", UNSUP, _TENANT),
    _f("enable_tenant_quota", B, "false", UNSUP, _TENANT),
    _f("default_tenant_quota_bytes", U, "0", UNSUP, _TENANT),
    _f("tenant_quota_pool_capacity_bytes", U, "0", UNSUP, _TENANT),
    _f("pod_name", S, "", UNSUP, "no Kubernetes label routing"),
    _f("pod_namespace", S, "", UNSUP, "no Kubernetes label routing"),
    # -- glog's flags, which every Mooncake binary takes
    _f("v", INT, "0", MAP, "log verbosity (1: info, 2: debug)"),
    _f("logtostderr", B, "false", NOOP, _LOG),
    _f("alsologtostderr", B, "false", NOOP, _LOG),
    _f("colorlogtostderr", B, "false", NOOP, _LOG),
    _f("stderrthreshold", INT, "2", NOOP, _LOG),
    _f("minloglevel", INT, "0", NOOP, _LOG),
    _f("log_dir", S, "", NOOP, _LOG),
    _f("vmodule", S, "", NOOP, _LOG),
    _f("max_log_size", U, "1800", NOOP, _LOG),
)

BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}

_BUILTINS = ("help", "helpfull", "helpshort", "version", "flagfile")
_TRUE = frozenset({"true", "t", "yes", "y", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "0"})
_INT_LIMITS = {FlagType.INT: (-(1 << 63), (1 << 63) - 1), FlagType.UINT: (0, (1 << 64) - 1)}


# ------------------------------------------------------------------------------ values


def parse_duration_ms(value: str, *, name: str) -> int:
    """Milliseconds from Mooncake's duration text: a non-negative integer, optionally followed
    by ms, s, m or h (any case, blanks allowed around); a bare number is milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
    if m is None:
        raise InvalidParams(
            f"--{name}={value}: expected a non-negative integer, optionally followed by "
            "ms, s, m or h"
        )
    unit = m.group(2).lower()
    factors = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
    if unit not in factors:
        raise InvalidParams(f"--{name}={value}: unknown unit {unit!r} (ms, s, m or h)")
    ms = int(m.group(1)) * factors[unit]
    if ms >= 1 << 64:
        raise InvalidParams(f"--{name}={value}: too large")
    return ms


def _parse_bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidParams(f"--{name}={text}: expected true or false")


def _check_value(flag: Flag, text: str) -> str:
    """The value as it will be used (booleans as "true"/"false"); InvalidParams if malformed."""
    name = flag.name
    if flag.type is FlagType.BOOL:
        return "true" if _parse_bool(name, text) else "false"
    if flag.type is FlagType.DURATION_MS:
        parse_duration_ms(text, name=name)
        return text
    if flag.type in (FlagType.INT, FlagType.UINT, FlagType.SECONDS, FlagType.PORT):
        try:
            n = int(text.strip(), 10)
        except ValueError:
            raise InvalidParams(f"--{name}={text}: expected an integer") from None
        low, high = _INT_LIMITS.get(flag.type, (0, (1 << 63) - 1))
        if flag.type is FlagType.PORT:
            low, high = 0, 65535
        if not low <= n <= high:
            raise InvalidParams(f"--{name}={text}: out of range [{low}, {high}]")
        return str(n)
    if flag.type is FlagType.DOUBLE:
        try:
            x = float(text)
        except ValueError:
            raise InvalidParams(f"--{name}={text}: expected a number") from None
        if math.isnan(x) or math.isinf(x):
            raise InvalidParams(f"--{name}={text}: expected a finite number")
        return text.strip()
    return text


def _unknown(name: str, table: Mapping[str, Flag] = BY_NAME, prog: str = "") -> InvalidParams:
    names = [*table, *_BUILTINS]
    near = difflib.get_close_matches(name.replace("-", "_"), names, n=1, cutoff=0.6)
    hint = f"; did you mean --{near[0]}?" if near else ""
    prog = prog or "mooncake_master"
    return InvalidParams(f"unknown command line flag '{name}'{hint} ({prog} --help)")


# ------------------------------------------------------------------------------ parsing


@dataclass
class Parsed:
    """A command line, read: the flags it set (name → text), and what else it asked for."""

    values: dict[str, str] = field(default_factory=dict)
    """Flags set on the command line or by `--config_path`, in Mooncake's names."""
    passthrough: list[str] = field(default_factory=list)
    """Arguments after `--`, for `kvpool master` unchanged."""
    positional: list[str] = field(default_factory=list)
    """Arguments that are not flags (gflags leaves them to the program; the master ignores
    them)."""
    help: bool = False
    version: bool = False


def parse_argv(
    argv: Sequence[str],
    *,
    read_file: Callable[[str], str] | None = None,
    table: Mapping[str, Flag] = BY_NAME,
    prog: str = "",
    _depth: int = 0,
) -> Parsed:
    """Read `argv` (without the program name) with gflags' rules; InvalidParams on an unknown
    flag (naming the nearest one), a missing or malformed value. `table`: the program's flags
    by name (the master's by default)."""
    read = read_file or (lambda p: Path(p).read_text(encoding="utf-8"))
    out = Parsed()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out.passthrough = list(argv[i:])
            break
        if not arg.startswith("-") or arg == "-":
            out.positional.append(arg)
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, eq, text = body.partition("=")
        if name in ("help", "helpfull", "helpshort"):
            out.help = True
            continue
        if name == "version":
            out.version = True
            continue
        if name == "flagfile":
            if not eq:
                if i >= len(argv):
                    raise InvalidParams("flag '--flagfile' is missing its argument")
                text, i = argv[i], i + 1
            if _depth > 8:
                raise InvalidParams(f"--flagfile={text}: nested too deep")
            try:
                content = read(text)
            except OSError as exc:
                raise InvalidParams(f"--flagfile={text}: {exc.strerror or exc}") from exc
            lines = [ln.strip() for ln in content.splitlines()]
            inner = parse_argv(
                [ln for ln in lines if ln and not ln.startswith("#")],
                read_file=read,
                table=table,
                prog=prog,
                _depth=_depth + 1,
            )
            out.values.update(inner.values)
            out.passthrough += inner.passthrough
            out.positional += inner.positional
            continue
        flag = table.get(name)
        if flag is None and not eq and name.startswith("no") and name[2:] in table:
            negated = table[name[2:]]
            if negated.type is FlagType.BOOL:
                out.values[negated.name] = "false"
                continue
        if flag is None:
            raise _unknown(name, table, prog)
        if not eq:
            if flag.type is FlagType.BOOL:
                out.values[name] = "true"
                continue
            if i >= len(argv):
                raise InvalidParams(f"flag '--{name}' is missing its argument")
            text, i = argv[i], i + 1
        out.values[name] = _check_value(flag, text)
    return out


def load_config_file(path: str, *, read_file: Callable[[str], str] | None = None) -> dict[str, str]:
    """The flags of a `--config_path` JSON file (Mooncake's keys are its flag names)."""
    read = read_file or (lambda p: Path(p).read_text(encoding="utf-8"))
    try:
        data = json.loads(read(path))
    except OSError as exc:
        raise InvalidParams(f"--config_path={path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise InvalidParams(f"--config_path={path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InvalidParams(f"--config_path={path}: expected a JSON object of flag names")
    values: dict[str, str] = {}
    for key, raw in data.items():
        flag = BY_NAME.get(str(key))
        if flag is None:
            raise _unknown(str(key))
        if isinstance(raw, bool):
            text = "true" if raw else "false"
        elif isinstance(raw, int | float | str):
            text = str(raw)
        else:
            raise InvalidParams(f"--config_path={path}: {key}: expected a number, bool or string")
        values[flag.name] = _check_value(flag, text)
    return values


# ------------------------------------------------------------------------------ translation


@dataclass
class Launch:
    """What to run: `kvpool master` arguments meaning what the Mooncake flags meant."""

    argv: list[str]
    """Arguments of `kvpool master` (without `--ha`, see `ha_url`)."""
    ha_url: str | None = None
    """HA: the etcd URL for `kvpool master --ha` (`etcd://H:P[,H:P]/CLUSTER_ID`), or None."""
    warnings: list[str] = field(default_factory=list)
    """One line per flag of a feature kvpool lacks, and per difference worth a warning."""
    notes: list[str] = field(default_factory=list)
    """Informational lines (flags accepted with no effect)."""
    verbosity: int = 0


def mooncake_etcd_url(endpoints: str, cluster_id: str) -> str:
    """kvpool's etcd URL (`etcd://h1:2379,h2:2379/CLUSTER_ID`) from Mooncake's endpoint list
    (`h1:2379;h2:2379`, also comma-separated, with or without `http://` / `etcd://`)."""
    hosts: list[str] = []
    for part in re.split(r"[;,]", endpoints):
        host = part.strip()
        for scheme in ("etcd://", "http://", "https://"):
            if host.lower().startswith(scheme):
                host = host[len(scheme) :]
        host = host.rstrip("/")
        if host:
            hosts.append(host)
    if not hosts:
        raise InvalidParams(f"no etcd endpoint in {endpoints!r}")
    if not cluster_id or "/" in cluster_id:
        raise InvalidParams(f"cluster id {cluster_id!r}: must be non-empty, without '/'")
    return f"etcd://{','.join(hosts)}/{cluster_id}"


def _interface_address(name: str) -> str:
    import socket

    import psutil

    addrs = psutil.net_if_addrs().get(name)
    if addrs is None:
        known = ", ".join(sorted(psutil.net_if_addrs()))
        raise InvalidParams(f"--rpc_interface={name}: no such interface (have: {known})")
    for a in addrs:
        if a.family == socket.AF_INET:
            return str(a.address)
    raise InvalidParams(f"--rpc_interface={name}: the interface has no IPv4 address")


def translate(
    values: Mapping[str, str],
    *,
    env: Mapping[str, str] | None = None,
    interface_address: Callable[[str], str] = _interface_address,
) -> Launch:
    """The `kvpool master` arguments for Mooncake flags `values` (name → text, as `parse_argv`
    leaves them; flags not in `values` keep Mooncake's default). `env` supplies
    `MOONCAKE_SNAPSHOT_LOCAL_PATH`. InvalidParams for a value kvpool cannot honour."""
    env = env or {}
    set_ = dict(values)
    out = Launch(argv=[])
    argv = out.argv

    def given(name: str) -> bool:
        return name in set_

    def get(name: str) -> str:
        return set_.get(name, BY_NAME[name].default)

    def num(name: str) -> int:
        return int(get(name))

    def secs(name: str) -> str:
        return f"{num(name)}s"

    # Where it serves. Mooncake: --rpc_port > 0 wins over the deprecated --port.
    port = num("rpc_port") if num("rpc_port") > 0 else num("port")
    argv += ["--port", str(port)]
    if given("rpc_interface") and get("rpc_interface"):
        argv += ["--host", interface_address(get("rpc_interface"))]
    elif given("rpc_address"):
        argv += ["--host", get("rpc_address")]
    else:
        out.warnings.append(
            "binding 127.0.0.1 (Mooncake binds 0.0.0.0): kvpool serves other hosts only when "
            "told to, with --rpc_address=0.0.0.0"
        )
    if given("rpc_conn_timeout_seconds") and num("rpc_conn_timeout_seconds") > 0:
        argv += ["--rpc-idle-timeout", secs("rpc_conn_timeout_seconds")]

    # Leases, pins, eviction: Mooncake's units made explicit.
    for name in ("default_kv_lease_ttl", "default_kv_soft_pin_ttl", "max_kv_soft_pin_ttl"):
        if given(name):
            ms = parse_duration_ms(get(name), name=name)
            argv += ["--" + name.replace("_", "-"), f"{ms}ms"]
    if given("allow_evict_soft_pinned_objects"):
        on = get("allow_evict_soft_pinned_objects") == "true"
        argv.append(f"--{'' if on else 'no-'}allow-evict-soft-pinned-objects")
    for name in ("eviction_ratio", "eviction_high_watermark_ratio"):
        if given(name):
            x = float(get(name))
            if not 0.0 <= x <= 1.0:
                raise InvalidParams(f"--{name}={get(name)}: must be between 0.0 and 1.0")
            argv += ["--" + name.replace("_", "-"), get(name)]
    if given("client_ttl"):
        if num("client_ttl") <= 0:
            raise InvalidParams(f"--client_ttl={get('client_ttl')}: must be > 0 seconds")
        argv += ["--client-ttl", secs("client_ttl")]
    for name in ("put_start_discard_timeout_sec", "put_start_release_timeout_sec"):
        if given(name):
            argv += ["--" + name.removesuffix("_sec").replace("_", "-"), secs(name)]
    strategy = get("allocation_strategy")
    if strategy in ("cxl", "ssd_free_ratio_first"):
        out.warnings.append(
            f"--allocation_strategy={strategy} is not supported by kvpool (no CXL or SSD "
            "segments); using random"
        )
    elif strategy in ("random", "free_ratio_first", "local_first"):
        if given("allocation_strategy"):
            argv += ["--allocation-strategy", strategy]
    else:
        raise InvalidParams(
            f"--allocation_strategy={strategy}: one of random, free_ratio_first, local_first, "
            "cxl, ssd_free_ratio_first"
        )
    allocator = get("memory_allocator")
    if allocator == "cachelib":
        out.warnings.append(
            "--memory_allocator=cachelib is not supported by kvpool; using its offset allocator"
        )
    elif allocator != "offset":
        raise InvalidParams(f"--memory_allocator={allocator}: one of offset, cachelib")
    if given("processing_task_timeout_sec") and num("processing_task_timeout_sec") > 0:
        argv += ["--replica-task-timeout", secs("processing_task_timeout_sec")]

    if get("root_fs_dir"):  # the shared directory of DFS replicas (docs/parts/tiers.md)
        argv += ["--dfs-root", get("root_fs_dir")]

    _translate_ha(get, given, out, env)

    # The rest: accepted; one warning for each feature kvpool lacks that was asked for.
    for name, text in set_.items():
        flag = BY_NAME[name]
        if flag.support is Support.UNSUPPORTED and text != flag.default:
            out.warnings.append(f"--{name}={text} is ignored: {flag.kvpool}")
        elif flag.support is Support.NOOP and text != flag.default:
            out.notes.append(f"--{name}={text} has no effect on kvpool: {flag.kvpool}")
    out.verbosity = num("v")
    return out


def _translate_ha(
    get: Callable[[str], str],
    given: Callable[[str], bool],
    out: Launch,
    env: Mapping[str, str],
) -> None:
    argv = out.argv
    if get("enable_ha") == "true":
        backend = get("ha_backend_type").strip().lower()
        if backend != "etcd":
            raise InvalidParams(
                f"--ha_backend_type={backend}: kvpool's HA coordinates through etcd only"
            )
        endpoints = get("ha_backend_connstring") or get("etcd_endpoints")
        if not endpoints:
            raise InvalidParams(
                "--enable_ha needs --ha_backend_connstring or --etcd_endpoints (h1:2379;h2:2379)"
            )
        cluster = get("cluster_id") if given("cluster_id") else DEFAULT_HA_CLUSTER_ID
        out.ha_url = mooncake_etcd_url(endpoints, cluster)
        argv += ["--cluster-id", cluster]
    elif given("cluster_id"):
        # Without HA, Mooncake's cluster id only names persisted data; kvpool's names the pool
        # in every connection's handshake, so passing it on would lock out every Mooncake
        # client (which sends none). The pool keeps kvpool's id, as compat stores expect.
        out.notes.append("--cluster_id is used only with --enable_ha (kvpool's handshake id)")
    elif given("etcd_endpoints") or given("ha_backend_connstring"):
        out.notes.append("etcd endpoints are used only with --enable_ha (as in Mooncake)")

    snapshots = get("enable_snapshot") == "true" or get("enable_snapshot_restore") == "true"
    directory = get("snapshot_backup_dir") or env.get("MOONCAKE_SNAPSHOT_LOCAL_PATH", "")
    if snapshots:
        if not directory:
            raise InvalidParams(
                "--enable_snapshot needs a directory: --snapshot_backup_dir=DIR or "
                "MOONCAKE_SNAPSHOT_LOCAL_PATH (kvpool keeps snapshots and its operation log "
                "there, as `kvpool master --data-dir`)"
            )
        argv += ["--data-dir", directory]
    elif given("snapshot_backup_dir"):
        out.notes.append("--snapshot_backup_dir is used only with --enable_snapshot")
    if given("snapshot_interval_seconds"):
        if int(get("snapshot_interval_seconds")) <= 0:
            raise InvalidParams("--snapshot_interval_seconds: must be > 0")
        argv += ["--snapshot-interval", f"{int(get('snapshot_interval_seconds'))}s"]
    store = next(
        (
            get(n)
            for n in (
                "snapshot_object_store_type",
                "snapshot_payload_store_type",
                "snapshot_payload_backend_type",
                "snapshot_backend_type",
            )
            if get(n)
        ),
        "",
    )
    if store not in ("", "local"):
        out.warnings.append(
            f"snapshot object store {store!r} is not supported: kvpool keeps snapshots in its "
            "data directory"
        )
    catalog = get("snapshot_catalog_store_type") or get("snapshot_catalog_backend_type")
    if catalog not in ("", "embedded", "payload"):
        out.warnings.append(
            f"snapshot catalog store {catalog!r} is not supported: kvpool's catalog is its "
            "data directory"
        )


def merge(config_file: Mapping[str, str], command_line: Mapping[str, str]) -> dict[str, str]:
    """Mooncake's precedence: a flag on the command line, else the config file, else default."""
    return {**config_file, **command_line}


# ------------------------------------------------------------------------------ docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def flag_table_markdown(flags: Iterable[Flag] = FLAGS) -> str:
    """The flag table of docs/compat.md (between its `mooncake_master flags` markers)."""
    rows = [
        "| Flag | Type (unit) | Mooncake default | kvpool |",
        "|---|---|---|---|",
    ]
    for f in flags:
        default = f.default if f.default != "" else '""'
        what = f.kvpool if f.support is Support.MAPPED else f"{f.support.value}: {f.kvpool}"
        rows.append(f"| `--{f.name}` | {f.type.value} | `{default}` | {_cell(what)} |")
    return "\n".join(rows) + "\n"


def help_text() -> str:
    """`mooncake_master --help`: the flags, Mooncake's defaults, and what each does here."""
    lines = [
        "mooncake_master (kvpool): runs a kvpool master from Mooncake's master flags.",
        "",
        "Flags as in Mooncake (gflags): --flag=value, --flag value, -flag, --flag/--noflag.",
        "Arguments after `--` go to `kvpool master` unchanged.",
        "",
    ]
    for f in FLAGS:
        what = f.kvpool if f.support is Support.MAPPED else f"[{f.support.value}] {f.kvpool}"
        default = f.default if f.default != "" else '""'
        lines.append(f"  --{f.name} ({f.type.value}, default {default}): {what}")
    return "\n".join(lines) + "\n"


BEGIN_MARK = "<!-- mooncake_master flags: begin (generated by `python -m kvpool.compat.mooncake_flags --write-docs docs/compat.md`; do not edit) -->\n"
END_MARK = "<!-- mooncake_master flags: end -->"


def write_docs(path: str) -> bool:
    """Put the current flag table between the markers of the page at `path`; True if changed."""
    page = Path(path)
    text = page.read_text(encoding="utf-8")
    start = text.find(BEGIN_MARK[:32])
    end = text.find(END_MARK)
    if start < 0 or end < start:
        raise InvalidParams(f"{path}: no mooncake_master flag table markers")
    new = text[:start] + BEGIN_MARK + flag_table_markdown() + text[end:]
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":  # `python -m kvpool.compat.mooncake_flags --write-docs docs/compat.md`
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "--write-docs":
        sys.stderr.write("usage: python -m kvpool.compat.mooncake_flags --write-docs PAGE\n")
        raise SystemExit(2)
    changed = write_docs(sys.argv[2])
    sys.stdout.write(f"{sys.argv[2]}: {'updated' if changed else 'up to date'}\n")
