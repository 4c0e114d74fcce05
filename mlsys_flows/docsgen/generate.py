"""Every generated file of the repository, made by one generator: ``mlsys-flows generate``.

Each entry maps a path (relative to the repository) to the function that renders its whole text
from the registry, the flow parameters and the committed RunReports. ``generate --check`` (and
``tests/unit/test_generated.py``) fails when any file on disk differs from what it renders, so a
generated file is never edited by hand and never goes stale.
"""
from __future__ import annotations

import json
from typing import Callable

from mlsys_flows import registry
from mlsys_flows.docsgen import catalogue, limits, readme
from mlsys_flows.platform import deploy, infra
from mlsys_flows.settings import project_root

REPO = project_root()  # generated files are the checkout's; installed, files() refuses


def _readme() -> str:
    return readme.render((REPO / "README.md").read_text())


def _system_page(name: str) -> Callable[[], str]:
    return lambda: readme.render_system(name, (REPO / "docs" / f"{name}.md").read_text())


def _work_pool(pool_type: str) -> Callable[[], str]:
    return lambda: json.dumps(infra.job_template(pool_type), indent=2) + "\n"


def files() -> dict[str, Callable[[], str]]:
    """path -> renderer, for every generated file."""
    if not (REPO / "README.md").exists():  # installed from the wheel: no README or docs to regenerate
        raise RuntimeError(f"generated files live in a source checkout, not in {REPO}; run `mlsys-flows generate` "
                           "in a clone of the repository")
    out: dict[str, Callable[[], str]] = {
        "README.md": _readme,
        "docs/limits.md": limits.render_markdown,
        "docs/results.md": lambda: catalogue.results_markdown(),
        "prefect.yaml": deploy.render,
    }
    for spec in registry.all_specs():
        if (REPO / "docs" / f"{spec.name}.md").exists():
            out[f"docs/{spec.name}.md"] = _system_page(spec.name)
    for pool_type in infra.POOL_TYPES:
        out[f"infra/work-pools/{pool_type}.json"] = _work_pool(pool_type)
    return out


def stale() -> list[str]:
    """Generated files whose content differs from what they render to (or that are missing)."""
    return [path for path, render in files().items()
            if not (REPO / path).exists() or (REPO / path).read_text() != render()]


def write() -> list[str]:
    """Rewrite every stale generated file; returns the paths written."""
    written = []
    for path, render in files().items():
        text = render()
        target = REPO / path
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(path)
    return written
