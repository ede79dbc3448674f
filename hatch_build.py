"""Build hook (hatchling): compile kvpool's fused copy-and-checksum during `pip install`.

It runs `src/kvpool/transfer/native/build.py` (loaded by path: kvpool is not installed yet),
which compiles copyhash.c into `_copyhash.so` beside it with the system C compiler. An
editable install uses the library where it was built; a wheel carries it (and is tagged for
this platform). It never fails an install: without a compiler, or when compiling fails, it
says so and kvpool copies and hashes in Python (`kvpool.transfer.native`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_BUILD = "src/kvpool/transfer/native/build.py"
_LIBRARY = "src/kvpool/transfer/native/_copyhash.so"


class NativeBuildHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        try:
            spec = importlib.util.spec_from_file_location(
                "_kvpool_native_build", Path(self.root, _BUILD)
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            built = module.build()
        except Exception as exc:  # an install never fails for this
            print(
                f"kvpool: the fused copy was not built ({exc}); copies hash in Python",
                file=sys.stderr,
            )
            return
        if built is None:
            print("kvpool: no C compiler; copies are checksummed in Python", file=sys.stderr)
            return
        if version != "editable":
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(_LIBRARY)
