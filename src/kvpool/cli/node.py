"""`kvpool node`: a process that only contributes memory to a pool.

It registers with the master, creates and pre-faults its segment (with a progress bar: a
multi-GiB segment takes seconds to fault in), mounts it, serves transfers into it, and pings the
master every second (remounting when the master restarted or expired it). It prints
`listening on HOST:PORT` (its transfer server) once it is mounted, executes the replica copy/move
tasks the master assigns to it (`kvpool.client.tasks`), and on SIGINT or SIGTERM it unmounts at
the master and frees the segment before exiting 0.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import click

from kvpool.cli.params import Duration, MasterAddress, Name, Size
from kvpool.cli.tiers import DiskCheck, node_tier_options
from kvpool.cli.tls import tls_config, tls_options
from kvpool.client import dfs
from kvpool.client.config import DEFAULT_TRANSFER_TIMEOUT_S
from kvpool.client.datapath import DataPath
from kvpool.client.disk import DiskTier, DiskTierSet
from kvpool.client.drain import drain_node
from kvpool.client.node import MIN_SEGMENT_SIZE, NodeRuntime
from kvpool.client.tasks import TaskExecutor
from kvpool.client.validation import check_segment_size
from kvpool.config import format_size
from kvpool.demo.progress import ProgressBar
from kvpool.errors import KVPoolError
from kvpool.fdlimit import raise_fd_limit
from kvpool.ops.node import NodeHttp
from kvpool.rpc.auth import client_token
from kvpool.transfer.limits import ServerLimits, set_default_limits
from kvpool.transfer.memory import SegmentMemory

__all__ = ["node"]

_POLL_S = 0.1


def _rss_shmem() -> int:
    """Bytes of shared memory this process has faulted in (RssShmem in /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def open_disk_tier(
    runtime: NodeRuntime,
    data: DataPath,
    directory: str,
    size: int,
    check: DiskCheck = DiskCheck(),  # noqa: B008 (frozen)
) -> DiskTier:
    """Open, verify and mount the disk tier in `directory` (checked as `check` says); says
    what it found."""
    try:
        disk = DiskTier(directory, size, **check.kwargs())
    except KVPoolError as exc:
        raise click.ClickException(exc.message) from exc
    try:
        mem = disk.mount(runtime, data.engine.attach_local)
    except BaseException:
        disk.close()
        raise
    st = disk.stats
    click.echo(
        f"kvpool node: disk tier {mem.name} ({format_size(size)} in {disk.directory}): "
        f"{st.verified} object(s) verified, {st.refused} refused; {check.describe()}"
    )
    return disk


def mount_with_progress(
    runtime: NodeRuntime,
    size: int,
    show: bool = True,
    on_created: Callable[[SegmentMemory], None] | None = None,
) -> SegmentMemory:
    """Mount a segment of `size` bytes, drawing a bar while its pages are faulted in.

    The mapping is populated inside one mmap() call (which releases the GIL), so it runs in a
    helper thread while this one watches the process's shared RSS grow.
    """
    result: list[SegmentMemory] = []
    error: list[BaseException] = []

    def work() -> None:
        try:
            result.append(runtime.mount(size, on_created=on_created))
        except BaseException as exc:
            error.append(exc)

    base = _rss_shmem()
    t = threading.Thread(target=work, name="kvpool-node-mount", daemon=True)
    t.start()
    bar = ProgressBar("pre-fault", size) if show else None
    try:
        while t.is_alive():
            t.join(_POLL_S)
            if bar is not None:
                bar.advance(max(0, min(size, _rss_shmem() - base)) - bar.done)
        if bar is not None and not error:
            bar.advance(size - bar.done)
    finally:
        if bar is not None:
            bar.close()
    if error:
        raise error[0]
    return result[0]


@click.command()
@click.option(
    "--master",
    required=True,
    type=MasterAddress(),
    help="HOST:PORT of the master, or etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID to find and "
    "follow the leader of a highly available cluster (the cluster id is the URL's).",
)
@click.option(
    "--segment-size",
    default="1GiB",
    show_default=True,
    type=Size(minimum=MIN_SEGMENT_SIZE),
    help="Memory to contribute.",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, type=Name(), help="Address to serve on."
)
@click.option("--cluster-id", default="kvpool", show_default=True, type=Name())
@click.option(
    "--heartbeat-interval", default="1s", show_default=True, type=Duration(0.01, 3600), hidden=True
)
@click.option(
    "--task-poll-interval",
    default="50ms",
    show_default=True,
    type=Duration(0.001, 3600),
    help="How often to ask the master for replica copy/move tasks to execute.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar while pre-faulting.")
# -- transfer server limits (issue #13, docs/parts/limits.md) --
@click.option(
    "--transfer-workers",
    default=ServerLimits().workers,
    show_default=True,
    type=click.IntRange(1),
    help="Threads serving transfers at once (idle connections cost none).",
)
@click.option(
    "--transfer-max-connections",
    default=ServerLimits().max_connections,
    show_default=True,
    type=click.IntRange(1),
    help="Transfer connections held at once (lowered to fit the file-descriptor limit).",
)
@click.option(
    "--transfer-max-connections-per-peer",
    default=ServerLimits().max_connections_per_peer,
    show_default=True,
    type=click.IntRange(1),
    help="Transfer connections held at once from one remote IP.",
)
@click.option(
    "--transfer-first-request-timeout",
    default=f"{ServerLimits().first_request_timeout:g}s",
    show_default=True,
    type=Duration(0.001, 3600),
    help="A transfer connection that sends nothing this long after it opened is closed.",
)
@click.option(
    "--transfer-idle-timeout",
    default=f"{ServerLimits().idle_timeout:g}s",
    show_default=True,
    type=Duration(0.001, 3600),
    help="A transfer connection that sent nothing for this long is closed.",
)
@click.option(
    "--transfer-stall-timeout",
    default=f"{ServerLimits().stall_timeout:g}s",
    show_default=True,
    type=Duration(0.001, 3600),
    help="A transfer that moves no byte for this long fails and its connection is closed.",
)
@click.option(
    "--transfer-min-rate",
    default=f"{ServerLimits().min_rate >> 10}KiB",
    show_default=True,
    type=Size(minimum=1),
    help="Bytes/s below which a transfer's payload fails (after the stall timeout).",
)
@click.option(
    "--drain-grace",
    default=0.0,
    show_default=True,
    type=Duration(0, 24 * 3600),
    help="On SIGTERM, first drain the segment (the master moves pinned objects out and waits "
    "for read leases) for up to this long, then unmount; 0 unmounts at once.",
)
@click.option(
    "--http-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve /metrics (Prometheus: segment bytes, transfer-server requests, bytes and "
    "errors by op, connections) and /health on this port of --host (0: a free port).",
)
@node_tier_options
@click.option(
    "--token-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    metavar="PATH",
    help="File whose first line is the token to prove to a master with --auth-file "
    "[default: $KVPOOL_AUTH_TOKEN].",
)
@tls_options
def node(
    *,
    master: str,
    segment_size: int,
    host: str,
    cluster_id: str,
    heartbeat_interval: float,
    task_poll_interval: float,
    no_progress: bool,
    transfer_workers: int,
    transfer_max_connections: int,
    transfer_max_connections_per_peer: int,
    transfer_first_request_timeout: float,
    transfer_idle_timeout: float,
    transfer_stall_timeout: float,
    transfer_min_rate: int,
    drain_grace: float = 0.0,
    http_port: int | None = None,
    offload_dir: tuple[str, ...],
    offload_size: int,
    dfs_root: str | None,
    disk_check_interval: float | None = None,
    disk_check_per_round: int | None = None,
    disk_check_bytes_per_round: int | None = None,
    token_file: str | None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> None:
    """Contribute a memory segment to the pool at MASTER until SIGINT/SIGTERM."""
    # -- transfer server limits: this process's default, and room for its connections --
    try:
        set_default_limits(
            ServerLimits(
                workers=transfer_workers,
                max_connections=transfer_max_connections,
                max_connections_per_peer=transfer_max_connections_per_peer,
                first_request_timeout=transfer_first_request_timeout,
                idle_timeout=transfer_idle_timeout,
                stall_timeout=transfer_stall_timeout,
                min_rate=transfer_min_rate,
            )
        )
    except KVPoolError as exc:
        raise click.UsageError(exc.message) from exc
    raise_fd_limit()
    try:
        size = check_segment_size(segment_size, "--segment-size")
    except KVPoolError as exc:
        raise click.BadParameter(
            exc.message.removeprefix("--segment-size: "), param_hint="'--segment-size'"
        ) from exc
    check = DiskCheck(  # tiers: the disk tier's background check
        disk_check_interval, disk_check_per_round, disk_check_bytes_per_round
    ).given(offload_dir)
    try:  # tiers: DFS files under this process's path (kvpool.client.dfs), for its lifetime
        attached = None if dfs_root is None else dfs.attach(dfs_root)
    except KVPoolError as exc:
        raise click.BadParameter(exc.message, param_hint="'--dfs-root'") from exc
    interval = heartbeat_interval
    poll = task_poll_interval
    stop = threading.Event()

    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        runtime = NodeRuntime(
            master,
            host=host,
            heartbeat_interval=interval,
            cluster_id=cluster_id,
            name="kvpool-node",
            token=client_token(None, token_file),
            tls=tls_config(tls_cert, tls_key, tls_ca),
        )
    except KVPoolError as exc:
        raise click.ClickException(str(exc)) from exc
    # The node executes the replica tasks (copy, move, pool-mode swap-out) whose source is
    # its segment: it needs a data path of its own to write the targets.
    data = DataPath(runtime, "auto", DEFAULT_TRANSFER_TIMEOUT_S)
    executor: TaskExecutor | None = None
    http: NodeHttp | None = None
    disk: DiskTierSet | None = None
    try:
        try:
            runtime.start()
            t0 = time.perf_counter()
            mem = mount_with_progress(
                runtime, size, show=not no_progress, on_created=data.engine.attach_local
            )
        except KVPoolError as exc:
            raise click.ClickException(f"cannot join the pool at {master}: {exc}") from exc
        except OSError as exc:  # the transfer server cannot bind --host
            raise click.ClickException(f"cannot serve on --host {host}: {exc.strerror}") from exc
        executor = TaskExecutor(runtime, data, poll_interval=poll)
        if offload_dir:
            # One tier per directory; `disk` owns those opened so far if a later one fails.
            disk = DiskTierSet([])
            for directory in offload_dir:
                disk.tiers.append(open_disk_tier(runtime, data, directory, offload_size, check))
            executor.on_written = disk.on_task_written
            executor.on_disk_freed = disk.on_freed
        executor.start()
        runtime.on_pending_tasks = executor.wake
        click.echo(
            f"kvpool node: segment {mem.name} ({format_size(mem.size)}, pre-faulted in "
            f"{time.perf_counter() - t0:.1f} s) mounted at {master}"
            + (f" (leader {runtime.rpc.address})" if runtime.follower is not None else "")
        )
        click.echo(f"listening on {runtime.endpoint}")
        if http_port is not None:
            http = NodeHttp(runtime, host, http_port).start()
            h, p = http.address
            click.echo(f"kvpool node: http listening on {h}:{p}")
        while not stop.wait(1.0):
            pass
        if drain_grace > 0 and signals and signals[0] == signal.SIGTERM:
            click.echo(f"kvpool node: draining the segment (up to {drain_grace:g} s)")
            for name, r in drain_node(runtime, drain_grace).items():
                click.echo(
                    f"kvpool node: {name} {r.state}: moved {r.moved} of {r.must_keep} objects "
                    f"to keep, {r.failed} failed"
                )
        click.echo("kvpool node: stopping; unmounting the segment")
    finally:
        if http is not None:
            http.close()
        if executor is not None:
            executor.close()
        runtime.close()
        if disk is not None:
            disk.close()
        data.close()
        if attached is not None:
            dfs.detach(attached)
    click.echo("kvpool node: stopped")
