"""Every flag of every `kvpool` command refuses a bad value with click's usage error (exit 2)
naming the flag and the value, and no bad input ever ends in a Python traceback.

The reproduced cases run in process through click's `CliRunner`; the sweep parses every option
of every command with garbage values (`make_context` converts and checks every parameter
without running the command); one spawned process per command checks what a user sees.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from kvpool.cli import _BENCHMARKS, _COMMANDS, bench, main
from kvtest.procs import run_kvpool

BAD_SIZES = ["0", "-1", "1XB", "100", "abc", "1000TiB", "99999999999999999999TiB"]


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


@pytest.mark.parametrize(
    "args, flag, value",
    [
        (["node", "--master", "127.0.0.1:1", "--segment-size", "0"], "--segment-size", "0"),
        (["node", "--master", "127.0.0.1:1", "--segment-size", "-1"], "--segment-size", "-1"),
        (["node", "--master", "127.0.0.1:1", "--segment-size", "1XB"], "--segment-size", "1XB"),
        (["node", "--master", "127.0.0.1:1", "--segment-size", "100"], "--segment-size", "100"),
        (["node", "--master", "127.0.0.1:1", "--segment-size", "1000TiB"], "--segment-size", "TiB"),
        (["node", "--master", "nowhere", "--segment-size", "1MiB"], "--master", "nowhere"),
        (["node", "--master", "127.0.0.1:1", "--task-poll-interval", "abc"], "--task-poll", "abc"),
        (["node", "--master", "127.0.0.1:1", "--task-poll-interval", "0"], "--task-poll", "'0'"),
        (["node", "--master", "127.0.0.1:1", "--cluster-id", ""], "--cluster-id", "empty"),
        (["up", "--segment-size", "abc"], "--segment-size", "abc"),
        (["up", "--segment-size", "1000TiB"], "--segment-size", "TiB"),
        (["up", "--client-ttl", "-1"], "--client-ttl", "-1"),
        (["up", "--client-ttl", "99999999999999999999h"], "--client-ttl", "maximum"),
        (["up", "--refresh", "0"], "--refresh", "'0'"),
        (["up", "--port", "70000"], "--port", "70000"),
        (["master", "--cluster-id", ""], "--cluster-id", "empty"),
        (["master", "--client-ttl", "99999999999999999999h"], "--client-ttl", "maximum"),
        (["master", "--num-shards", "9999999999"], "--num-shards", "9999999999"),
        (["master", "--max-arena-size", "2PiB"], "--max-arena-size", "2PiB"),
        (["master", "--default-kv-soft-pin-ttl", "48h"], "--default-kv-soft-pin-ttl", "172800"),
        (["status", "--master", "localhost"], "--master", "localhost"),
        (["status", "--timeout", "nan"], "--timeout", "nan"),
        (["demo", "--layers", "0"], "--layers", "0"),
        (["demo", "--segment-size", "1000TiB"], "--segment-size", "TiB"),
        (["demo", "--master", "x"], "--master", "'x'"),
        # Checked in the command's body, not by click: still a usage error, no traceback.
        (["bench", "store", "--segment-size", "abc"], "--segment-size", "abc"),
        (["bench", "store", "--master", "nowhere"], "master", "nowhere"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag_and_the_value(
    args: list[str], flag: str, value: str
) -> None:
    result = run(*args)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 2, result.output
    assert flag in result.output and value in result.output, result.output


def _commands() -> list[tuple[str, click.Command]]:
    ctx = click.Context(main)
    out: list[tuple[str, click.Command]] = []
    for name in _COMMANDS:
        cmd = main.get_command(ctx, name)
        if cmd is not None and name != "bench":
            out.append((name, cmd))
    for name in _BENCHMARKS:
        cmd = bench.get_command(ctx, name)
        if cmd is not None:
            out.append((f"bench {name}", cmd))
    return out


GARBAGE = [
    "",
    "abc",
    "-1",
    "1e999",
    "nan",
    "99999999999999999999999",
    "1XB",
    "\x01",
]  # argv cannot hold NUL


@pytest.mark.parametrize("name, cmd", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_of_every_command_parses_garbage_without_a_traceback(
    name: str, cmd: click.Command
) -> None:
    """Parsing (conversion and callbacks of every parameter) either accepts a value or raises
    click's own errors: nothing else escapes, whatever the text."""
    required = {"--master": "127.0.0.1:1"}
    for param in cmd.params:
        if not isinstance(param, click.Option) or param.is_flag or param.count:
            continue
        flag = max(param.opts, key=len)
        base: list[str] = []
        for k, v in required.items():
            if k != flag and any(k in p.opts for p in cmd.params):
                base += [k, v]
        for junk in GARBAGE:
            try:
                cmd.make_context(name, [*base, flag, junk], resilient_parsing=False)
            except click.ClickException:
                pass
            except click.exceptions.Exit:
                pass


@pytest.mark.parametrize(
    "args",
    [
        ["node", "--master", "127.0.0.1:1", "--segment-size", "1XB"],
        ["up", "--segment-size", "abc"],
        ["master", "--cluster-id", ""],
        ["status", "--master", "nowhere"],
        ["demo", "--layers", "-3"],
        ["bench", "store", "--no-such-flag"],
    ],
    ids=lambda a: a[0] if a[0] != "bench" else "bench",
)
def test_a_user_sees_one_error_line_and_no_traceback(args: list[str]) -> None:
    out = run_kvpool(*args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "Error:" in out.stderr
