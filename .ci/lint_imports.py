#!/usr/bin/env python3
"""Run import-linter (`lint-imports`, contracts in pyproject.toml) on the whole mlsys_flows namespace.

Why not plain `lint-imports`: setup.py maps the top-level folders systems/, tasks/, flows/ and
blocks/ into ``mlsys_flows.*`` with ``package-dir``. The editable install resolves them with an
import hook, but grimp (import-linter's graph builder) walks the package's *directory*,
mlsys_flows/, so it would see only the platform modules and none of the layers. This script builds
the installed layout as a tree of symlinks, build/import-graph/mlsys_flows/ (each entry of
mlsys_flows/ plus one link per mapped folder, read from setup.py's LAYERS), and runs lint-imports
from there (import-linter puts its working directory first on sys.path, so it finds that tree)
with ``--config`` pointing back at pyproject.toml. The links point at the working tree, so what
is checked is the code as it is now.

    python .ci/lint_imports.py [lint-imports options, e.g. --verbose]   (= `make lint`)
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "build" / "import-graph"


def mapped_layers(repo: Path = REPO) -> tuple[str, ...]:
    """setup.py's LAYERS: the top-level folders installed as ``mlsys_flows.<folder>``."""
    setup_py = repo / "setup.py"
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{setup_py}: no LAYERS = (...) assignment")


def build_tree(tree: Path = TREE, repo: Path = REPO) -> Path:
    """(Re)build tree/mlsys_flows as the installed layout of ``repo``'s sources; returns ``tree``."""
    package = tree / "mlsys_flows"
    shutil.rmtree(tree, ignore_errors=True)
    package.mkdir(parents=True)
    layers = mapped_layers(repo)
    for entry in sorted((repo / "mlsys_flows").iterdir()):
        if entry.name == "__pycache__" or entry.name in layers:
            continue
        (package / entry.name).symlink_to(entry)
    for layer in layers:
        if not (repo / layer / "__init__.py").exists():
            raise RuntimeError(f"setup.py maps {layer}/ but {layer}/__init__.py does not exist")
        (package / layer).symlink_to(repo / layer, target_is_directory=True)
    return tree


def lint_imports_bin() -> str:
    """lint-imports next to this interpreter (the project's .venv), else on PATH."""
    here = Path(sys.executable).parent / "lint-imports"
    found = str(here) if here.exists() else shutil.which("lint-imports")
    if not found:
        raise SystemExit("lint-imports not found: pip install -e '.[test]' (import-linter)")
    return found


def command(*args: str, repo: Path = REPO) -> list[str]:
    return [lint_imports_bin(), "--config", str(repo / "pyproject.toml"), "--no-cache", *args]


def run(*args: str, repo: Path = REPO, tree: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """lint-imports on ``repo``'s sources (the tree goes under repo/build/import-graph by default)."""
    tree = build_tree(tree or repo / "build" / "import-graph", repo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(command(*args, repo=repo), cwd=tree, env=env, **kwargs)


if __name__ == "__main__":
    sys.exit(run(*sys.argv[1:]).returncode)
