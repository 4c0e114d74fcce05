"""`registry.get(name)` imports that system's package alone, and reading a spec loads no engine.

Every flow module, warm Dask worker and CLI call reads one spec; each runs in a fresh interpreter
here (one subprocess per system, run side by side), which records the modules ``get`` imported: no
other system's package (only ``systems.common`` and the system's family package, e.g. ``moe``,
``llm_serving``) and none of the heavy libraries an engine needs. A spec is its Params model and its
claims: pydantic and dataclasses. Listing the catalogue (`mlsys-flows list`) stays as light.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mlsys_flows import registry

REPO = Path(__file__).resolve().parents[2]
# What the engines import, never a spec: measured with `python -X importtime`, each costs from 0.1 s
# (numpy) to seconds (torch) of every process that only reads a spec.
HEAVY = ("torch", "numpy", "scipy", "sklearn", "pandas", "pyarrow", "transformers", "matplotlib", "httpx",
         "cryptography", "prefect", "dask", "distributed")
SHARED = "common"  # systems.common: every system's

SCRIPT = """
import json, sys
from mlsys_flows import registry
before = set(sys.modules)
spec = registry.get(sys.argv[1]) if sys.argv[1] != "--all" else registry.all_specs()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def _imports(name: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, name], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def imported() -> dict[str, list[str]]:
    """name -> the modules ``registry.get(name)`` imported (``--all``: ``registry.all_specs()``)."""
    runs = [*registry.names(), "--all"]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(runs, pool.map(_imports, runs)))


def _system_packages(modules: list[str]) -> set[str]:
    return {m.split(".")[2] for m in modules if m.startswith("mlsys_flows.systems.")}


def _heavy(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & set(HEAVY))


def _family_package(name: str) -> str:
    return registry.get(name).family.replace("-", "_")


@pytest.mark.parametrize("name", registry.names())
def test_get_imports_that_system_alone_and_no_engine(imported, name):
    modules = imported[name]
    others = _system_packages(modules) - {name, SHARED, _family_package(name)}
    assert not others, f"registry.get({name!r}) imported other systems' packages: {sorted(others)}"
    assert name in _system_packages(modules)
    heavy = _heavy(modules)
    assert not heavy, (f"registry.get({name!r}) imported {heavy} ({len(modules)} modules): move the import into "
                       f"the function that uses it, or behind the package's lazy exports (systems/common/lazy.py)")


def test_listing_the_catalogue_imports_every_system_and_no_engine(imported):
    modules = imported["--all"]
    assert set(registry.names()) <= _system_packages(modules)
    assert not _heavy(modules), f"registry.all_specs() imported {_heavy(modules)}"
