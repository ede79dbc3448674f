"""Click parameter types for kvpool's flags: sizes, durations, addresses, names.

Every flag of every `kvpool` command converts its text through one of these (or one of click's
own: `IntRange`, `Choice`), so a bad value is click's usage error (exit 2) naming the flag and
the value, never a traceback. The conversions are those of `kvpool.config` (`parse_size`,
`parse_duration`) and `kvpool.rpc.client.parse_address`, with their maxima.
"""

from __future__ import annotations

from typing import Any

import click

from kvpool.config import MAX_DURATION_S, MAX_SIZE, parse_duration, parse_size
from kvpool.errors import KVPoolError
from kvpool.ha.url import EtcdUrl
from kvpool.rpc.client import parse_address

__all__ = ["Address", "Duration", "Name", "Size"]


class Size(click.ParamType[int]):
    """Bytes from "4GiB", "512MB", "1024", between `minimum` and `maximum`."""

    name = "size"

    def __init__(self, minimum: int = 0, maximum: int = MAX_SIZE) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            text: str | int = value
        else:
            text = str(value)
        try:
            return parse_size(text, name=str(value), minimum=self.minimum, maximum=self.maximum)
        except KVPoolError as exc:
            self.fail(_reason(exc.message, str(value)), param, ctx)


class Duration(click.ParamType[float]):
    """Seconds from "10s", "500ms", "30min", "24h" or a bare number of seconds, between
    `minimum` and `maximum`."""

    name = "duration"

    def __init__(self, minimum: float = 0.0, maximum: float = MAX_DURATION_S) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            text: str | float = value
        else:
            text = str(value)
        try:
            return parse_duration(text, name=str(value), minimum=self.minimum, maximum=self.maximum)
        except KVPoolError as exc:
            self.fail(_reason(exc.message, str(value)), param, ctx)


class Address(click.ParamType[str]):
    """ "HOST:PORT" (the port 1..65535), kept as the text given."""

    name = "host:port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            parse_address(text)
        except KVPoolError:
            self.fail(f"{text!r} is not HOST:PORT (for example 127.0.0.1:50051)", param, ctx)
        return text


class MasterAddress(click.ParamType[str]):
    """ "HOST:PORT" of a master, or `etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID` of a highly
    available cluster (its leader is found through etcd), kept as the text given."""

    name = "host:port|etcd://..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if text.strip().lower().startswith("etcd://"):
            try:
                EtcdUrl.parse(text)
            except KVPoolError as exc:
                self.fail(exc.message, param, ctx)
            return text
        try:
            parse_address(text)
        except KVPoolError:
            self.fail(
                f"{text!r} is neither HOST:PORT (for example 127.0.0.1:50051) nor "
                "etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID",
                param,
                ctx,
            )
        return text


class Name(click.ParamType[str]):
    """A non-empty name without whitespace or control characters, of at most `max_len`
    characters (a cluster id, a host)."""

    name = "text"

    def __init__(self, max_len: int = 255) -> None:
        self.max_len = max_len

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text:
            self.fail("must not be empty", param, ctx)
        if len(text) > self.max_len:
            self.fail(f"{len(text)} characters, more than {self.max_len}", param, ctx)
        if any(c.isspace() or not c.isprintable() for c in text):
            self.fail(f"{text!r} contains whitespace or control characters", param, ctx)
        return text


def _reason(message: str, value: str) -> str:
    """`parse_*`'s message without the leading "NAME: " (click names the flag itself)."""
    prefix = f"{value}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
