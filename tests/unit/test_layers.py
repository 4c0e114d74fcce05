"""Layers are checked by a tool: `lint-imports` (import-linter, contracts in pyproject.toml) keeps
every contract, sees the whole mapped namespace, and each contract still fails on a forbidden import."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import shutil
import sys
from pathlib import Path

import pytest

from mlsys_flows import registry

try:
    import tomllib
except ImportError:  # Python 3.10: import-linter depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("mlsys_flows", "systems", "tasks", "flows", "blocks", "setup.py", "pyproject.toml")


def _lint_module():
    spec = importlib.util.spec_from_file_location("lint_imports", REPO / ".ci" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint = _lint_module()
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]


def _run(repo: Path, tree: Path):
    if not Path(lint.lint_imports_bin()).exists():
        pytest.fail("lint-imports missing: pip install -e '.[test]' (import-linter)")
    return lint.run(repo=repo, tree=tree, capture_output=True, text=True, timeout=120)


def test_lint_imports_keeps_every_contract(tmp_path):
    """`lint-imports` from the venv's bin (as `make lint` runs it) exits 0 with every contract kept."""
    assert Path(lint.lint_imports_bin()).parent == Path(sys.executable).parent  # the .venv's own
    out = _run(REPO, tmp_path / "tree")
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    n = len(CONFIG["contracts"])
    assert f"Contracts: {n} kept, 0 broken." in out.stdout, out.stdout[-3000:]


def test_graph_holds_the_mapped_layers(tmp_path):
    """setup.py maps systems/, tasks/, flows/, blocks/ into mlsys_flows.*; the graph import-linter
    checks (grimp, resolving mlsys_flows from the tree as lint-imports does) holds every module of
    every mapped folder, which the editable install alone would hide."""
    tree = lint.build_tree(tmp_path / "tree", REPO)
    code = ("import grimp; g = grimp.build_graph('mlsys_flows', cache_dir=None); "
            "print('\\n'.join(sorted(g.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-3000:]
    graph = set(out.stdout.split())
    expected = set()
    for folder, package in [("mlsys_flows", "mlsys_flows")] + [(d, f"mlsys_flows.{d}") for d in lint.mapped_layers()]:
        for path in (REPO / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            expected.add(".".join((package, *parts)))
    assert expected <= graph, sorted(expected - graph)[:20]
    assert {"mlsys_flows.systems.common.params", "mlsys_flows.flows.common", "mlsys_flows.tasks.common",
            "mlsys_flows.blocks.storage"} <= graph


def _family_package(family: str) -> str:
    return family.replace("-", "_")


def test_shared_system_packages_follow_the_rule():
    """Packages under systems/ are systems, `common`, or a family package named after a registry
    family; the independence contract lets only that family's systems import a family package."""
    packages = sorted(p.parent.name for p in (REPO / "systems").glob("*/__init__.py"))
    names = set(registry.names()) if hasattr(registry, "names") else {s.name for s in registry.SYSTEMS}
    members: dict[str, set[str]] = {}
    for name in packages:
        if name in names:
            members.setdefault(_family_package(registry.get(name).family), set()).add(name)
    shared = [p for p in packages if p not in names]
    assert "common" in shared
    for package in shared:
        assert package == "common" or package in members, (
            f"systems/{package}/ is neither a system, `common`, nor a family package (systems/<family>/ "
            f"with family one of {sorted(members)}): move it into its system or into systems.common")
    (contract,) = [c for c in CONFIG["contracts"] if c.get("id") == "systems-independent"]
    assert contract["modules"] == ["mlsys_flows.systems.*"]
    allowed: dict[str, set[str]] = {}
    for line in contract["ignore_imports"]:
        importer, imported = (s.strip() for s in line.split("->"))
        if imported in ("mlsys_flows.systems.common", "mlsys_flows.systems.common.**"):
            assert importer == "mlsys_flows.systems.**", line
            continue
        m_imp = re.fullmatch(r"mlsys_flows\.systems\.(\w+)(\.\*\*)?", importer)
        m_pkg = re.fullmatch(r"mlsys_flows\.systems\.(\w+)\.\*\*", imported)
        assert m_imp and m_pkg, f"ignore_imports line not of the allowed shapes: {line}"
        system, package = m_imp.group(1), m_pkg.group(1)
        assert package in shared and package != "common", line
        assert system in members.get(package, set()), f"{line}: {system} is not in family {package}"
        allowed.setdefault(package, set()).add(system)
    for package in shared:
        if package != "common":
            assert allowed.get(package) == members[package], (
                f"family package systems/{package}/: list every member system "
                f"{sorted(members[package])} in the independence contract's ignore_imports")


# One forbidden import per contract (and one module outside every layer): lint-imports must fail.
PROBES = {
    "systems-pure": ("systems/recd/workload.py", "import distributed"),
    "systems-pure (indirect)": ("systems/common/timing.py", "from mlsys_flows import runtime"),
    "declarations-pure": ("mlsys_flows/flow_params.py", "from mlsys_flows.blocks import ObjectStorage"),
    "systems-independent": ("systems/recd/workload.py", "from mlsys_flows.systems.dsi import data"),
    "systems-independent (family)": ("systems/recd/workload.py", "from mlsys_flows.systems.moe import model"),
    "blocks-below-flows": ("blocks/storage.py", "from mlsys_flows.tasks import common"),
    "layers": ("tasks/recd.py", "from mlsys_flows.flows import common"),
    "layers (unplaced module)": ("mlsys_flows/zz_new_module.py", "import os"),
    "layers (platform below integrations)": ("mlsys_flows/platform/server.py", "from mlsys_flows.integrations import webhooks"),
    "layers (docsgen apart from integrations)": ("mlsys_flows/docsgen/limits.py", "from mlsys_flows.integrations import webhooks"),
    "declarations-pure (prefect_rest)": ("mlsys_flows/platform/prefect_rest.py", "import prefect"),
    "declarations-pure (rendering)": ("mlsys_flows/rendering.py", "import prefect"),
    "devices-pure": ("mlsys_flows/devices/fpga/kernels.py", "import distributed"),
    "ranks-below-flows": ("mlsys_flows/platform/ranks.py", "from mlsys_flows.platform import runner"),
    "layers (errors at the bottom)": ("mlsys_flows/errors.py", "from mlsys_flows import settings"),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_each_contract_fails_on_a_forbidden_import(tmp_path, probe):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, repo / name)
    path, line = PROBES[probe]
    with open(repo / path, "a") as f:
        f.write(f"\n{line}  # probe\n")
    out = _run(repo, tmp_path / "tree")
    assert out.returncode == 1, (probe, out.stdout[-3000:])
    contract_id = probe.split(" ")[0]
    (contract,) = [c for c in CONFIG["contracts"] if c.get("id") == contract_id]
    flat = re.sub(r"\s+", " ", out.stdout)
    assert f"{contract['name']} BROKEN" in flat, flat[-3000:]
