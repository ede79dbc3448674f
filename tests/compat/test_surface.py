"""The surface of the compatibility layer, pinned against the real wheel's.

Every public method of Mooncake's `MooncakeDistributedStore` is either offered by kvpool's or
named in NOT_SUPPORTED (which docs/compat.md lists as "Not supported yet"), so a method added to
one side without the other fails here. The wheel is inspected in a child process: this needs no
opt-in, because nothing is set up (importing it binds no socket).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool.compat.mooncake as compat

NOT_SUPPORTED: set[str] = set()
"""Every method of the wheel's MooncakeDistributedStore is offered (the parallelism-descriptor
family, the last to come, in kvpool.compat.mooncake.tensor_parallel)."""

DOCS = Path(__file__).resolve().parents[2] / "docs" / "compat.md"


def _public(names: object) -> set[str]:
    return {n for n in names if not n.startswith("_")}  # type: ignore[attr-defined]


def test_the_public_names_of_kvpool_compat_mooncake() -> None:
    assert sorted(compat.__all__) == [
        "BufferHandle",
        "Descriptor",
        "DiskDescriptor",
        "MemoryDescriptor",
        "MooncakeConfig",
        "MooncakeDistributedStore",
        "MooncakeDistributedStoreAsync",
        "MooncakeHostMemAllocator",
        "ObjectDataType",
        "ParallelAxis",
        "QueryTaskResponse",
        "ReadTarget",
        "ReplicaDescriptor",
        "ReplicaStatus",
        "ReplicateConfig",
        "SoftPinAction",
        "TaskStatus",
        "TaskType",
        "TensorParallelism",
        "bind_to_numa_node",
    ]


def test_every_mooncake_method_is_offered_or_listed_as_not_supported() -> None:
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("the Mooncake wheel is not installed (pip install kvpool[bench])")
    probe = (
        "import json, mooncake.store as s;"
        "print(json.dumps(sorted(n for n in dir(s.MooncakeDistributedStore)"
        " if not n.startswith('_'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"mooncake.store does not import here: {done.stderr.strip()[-200:]}")
    real = set(json.loads(done.stdout.strip().splitlines()[-1]))
    ours = _public(dir(compat.MooncakeDistributedStore))
    assert real - ours == NOT_SUPPORTED
    assert ours - real == set()  # nothing invented under Mooncake's name


def test_the_docs_list_what_is_not_supported() -> None:
    text = DOCS.read_text(encoding="utf-8")
    # The parallelism-descriptor family is listed by pattern, everything else by name.
    assert "`*_with_parallelism*`" in text
    by_name = [n for n in NOT_SUPPORTED if "_with_parallelism" not in n]
    assert sorted(n for n in by_name if f"`{n}`" not in text) == []


def _wheel(probe: str) -> object:
    """What `probe` (a Python expression over `s`, the wheel's mooncake.store) prints as JSON,
    evaluated in a child process; skips where the wheel is missing or does not import."""
    if importlib.util.find_spec("mooncake") is None:
        pytest.skip("the Mooncake wheel is not installed (pip install kvpool[bench])")
    code = f"import json, mooncake.store as s; print(json.dumps({probe}))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"mooncake.store does not import here: {done.stderr.strip()[-200:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


ENUMS = ["ReplicaStatus", "SoftPinAction", "ObjectDataType", "TaskType", "TaskStatus"]


def test_enums_have_the_wheels_members_and_numbers() -> None:
    real = _wheel(
        "{e: [[k, int(v)] for k, v in getattr(s, e).__members__.items()] for e in "
        + repr(ENUMS)
        + "}"
    )
    ours = {e: [[k, int(v)] for k, v in getattr(compat, e).__members__.items()] for e in ENUMS}
    assert ours == real


DESCRIPTOR_CLASSES = [
    "ReplicaDescriptor",
    "MemoryDescriptor",
    "DiskDescriptor",
    "Descriptor",
    "QueryTaskResponse",
    "ParallelAxis",
    "TensorParallelism",
    "ReadTarget",
]


def test_descriptor_classes_offer_the_wheels_attributes() -> None:
    real = _wheel(
        "{c: sorted(n for n in dir(getattr(s, c)) if not n.startswith('_')) for c in "
        + repr(DESCRIPTOR_CLASSES)
        + "}"
    )
    assert isinstance(real, dict)
    for name, attrs in real.items():
        ours = _public(dir(getattr(compat, name)))
        assert sorted(ours) == attrs, name


def _compat_modules() -> list[Path]:
    return sorted(Path(compat.__file__).parent.glob("*.py"))


def test_no_module_of_the_compat_layer_is_over_800_lines() -> None:
    lines = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in _compat_modules()}
    assert {name: n for name, n in lines.items() if n > 800} == {}


def test_compat_takes_from_the_protocol_only_the_value_types_the_store_answers_with() -> None:
    """What kvpool/compat/__init__.py promises: no master, RPC or transfer import, and from
    kvpool.protocol only ReplicaDesc and ReplicaKind (what Store.get_replica_desc answers)."""
    import ast

    taken: dict[str, set[str]] = {}
    for path in _compat_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                taken.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                taken.update({a.name: set() for a in node.names})
    layers = ("kvpool.master", "kvpool.rpc", "kvpool.transfer")
    assert sorted(m for m in taken if m.startswith(layers)) == []
    protocol = {m: names for m, names in taken.items() if m.startswith("kvpool.protocol")}
    assert protocol == {"kvpool.protocol.messages": {"ReplicaDesc", "ReplicaKind"}}
