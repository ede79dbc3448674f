"""The master named by LMCache's `remote_url: mooncakestore://HOST:PORT/`, for `setup(dict)`.

LMCache's Mooncake connector (lmcache/v1/storage_backend/connector/mooncakestore_connector.py,
0.5.x) builds a setup dict from its `extra_config` and no longer passes the URL's host and port
on: with the real wheel the URL is ignored and the store joins whatever master the dict names,
or the default `127.0.0.1:50051`. Its documentation (and its 0.3.x code) make the URL the master
address, which is what users write. So when `setup(dict)` is called from LMCache's code, the
URL's `HOST:PORT` is the master address: taken from the calling connector's LMCache config
(`remote_url`), else `$LMCACHE_REMOTE_URL`, else the `remote_url` of the YAML file named by
`$LMCACHE_CONFIG_FILE`. Called from anything else, nothing here applies.

The caller is found by walking at most `MAX_FRAMES` frames up from `setup()`, looking for
modules whose name starts with "lmcache." (LMCache's setup helper, then its connector, whose
local `lmcache_config` carries the URL).
"""

from __future__ import annotations

import logging
import os
import sys
from types import FrameType
from typing import Final
from urllib.parse import urlsplit

__all__ = ["MAX_FRAMES", "SCHEME", "lmcache_master", "master_of_url"]

log = logging.getLogger(__name__)

SCHEME: Final = "mooncakestore"
MAX_FRAMES: Final = 16
"""How far up the stack `setup()` looks for LMCache's connector."""


def master_of_url(url: object) -> str | None:
    """ "HOST:PORT" of a `mooncakestore://HOST:PORT/...` URL; None for another URL or one
    without both."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != SCHEME or not parts.hostname or port is None:
        return None
    host = parts.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _lmcache_frames(start: FrameType | None) -> list[FrameType]:
    """The frames of `lmcache.*` modules among the `MAX_FRAMES` above `start`."""
    out: list[FrameType] = []
    frame = start
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        if str(frame.f_globals.get("__name__", "")).startswith("lmcache."):
            out.append(frame)
        frame = frame.f_back
    return out


def _url_from_frame(frame: FrameType) -> object:
    for name in ("lmcache_config", "config"):
        url = getattr(frame.f_locals.get(name), "remote_url", None)
        if isinstance(url, str):
            return url
    return None


def _url_from_file(path: str) -> object:
    try:
        import yaml  # LMCache depends on PyYAML

        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except Exception as exc:
        log.debug("LMCACHE_CONFIG_FILE %r: %s", path, exc)
        return None
    return data.get("remote_url") if isinstance(data, dict) else None


def lmcache_master() -> str | None:
    """The master address LMCache's URL names, when `setup()` was called from LMCache (module
    docstring); None otherwise."""
    frames = _lmcache_frames(sys._getframe(1))
    if not frames:
        return None
    try:
        # The setup helper's own config has no URL; the connector's, a frame above, has.
        candidates = [_url_from_frame(f) for f in frames]
    finally:
        del frames
    config_file = os.environ.get("LMCACHE_CONFIG_FILE")
    candidates += [
        os.environ.get("LMCACHE_REMOTE_URL"),
        _url_from_file(config_file) if config_file else None,
    ]
    for url in candidates:
        master = master_of_url(url)
        if master is not None:
            return master
    return None
