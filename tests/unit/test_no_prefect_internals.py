"""The project uses Prefect through its public surface only: no module imports a private Prefect name
(``from prefect.x import _y``, ``import prefect._internal``, a module path with a ``_`` part), reads a
private attribute of something imported from Prefect (``prefect.x._y``, ``Block._registry``), or
sets or reads one of Prefect's private ``PREFECT__*`` variables. A Prefect upgrade may change any of
those without notice. The checker is tested on bad snippets, so it can fail."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# everything the project ships or runs (tests are left out: two of them check Prefect's own contract,
# the variables its worker sets and the schema its `prefect deploy` validates against)
SCANNED = ("mlsys_flows", "systems", "tasks", "flows", "blocks", "benchmarks", "infra")
PRIVATE_VAR = re.compile(r"\bPREFECT__[A-Z0-9_]*")


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _prefect_module(name: str | None) -> bool:
    return bool(name) and (name == "prefect" or name.startswith("prefect."))


def violations(source: str, filename: str = "<snippet>") -> list[str]:
    """``file:line: what`` for every use of a Prefect internal in ``source``."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    from_prefect: set[str] = set()  # local names bound to a Prefect module or object
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _prefect_module(alias.name):
                    from_prefect.add(alias.asname or alias.name.split(".")[0])
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append((node.lineno, f"imports private module {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and _prefect_module(node.module) and not node.level:
            if any(_private(p) for p in node.module.split(".")):
                found.append((node.lineno, f"imports from private module {node.module}"))
            for alias in node.names:
                from_prefect.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append((node.lineno, f"imports private name {alias.name} from {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for var in sorted(set(PRIVATE_VAR.findall(node.value))):
                found.append((node.lineno, f"names Prefect's private variable {var}"))
    for node in ast.walk(tree):  # second pass: every Prefect name is known now
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in from_prefect:
                found.append((node.lineno, f"reads private attribute {ast.unparse(node)}"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def project_violations() -> list[str]:
    out = []
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            out += violations(path.read_text(), str(path.relative_to(REPO)))
    return out


def test_the_project_uses_no_prefect_internals():
    found = project_violations()
    assert not found, "Prefect internals used:\n" + "\n".join(found)


def test_every_scanned_folder_exists_and_holds_modules():
    # a renamed folder would otherwise be skipped silently
    assert all(any((REPO / folder).rglob("*.py")) for folder in SCANNED)


@pytest.mark.parametrize("snippet,expected", [
    ("from prefect.server.api.server import _memoize_block_auto_registration",
     "imports private name _memoize_block_auto_registration from prefect.server.api.server"),
    ("import prefect._internal.concurrency", "imports private module prefect._internal.concurrency"),
    ("from prefect._internal.compatibility import deprecated", "imports from private module prefect._internal"),
    ("from prefect.cli._server_utils import prestart_check", "imports from private module prefect.cli._server_utils"),
    ("import prefect.settings\nx = prefect.settings._cache", "reads private attribute prefect.settings._cache"),
    ("import prefect as pf\nx = pf.context._current", "reads private attribute pf.context._current"),
    ("from prefect.blocks.core import Block\nBlock._registry.clear()", "reads private attribute Block._registry"),
    ("import os\nos.environ['PREFECT__SERVER_EPHEMERAL'] = '1'", "private variable PREFECT__SERVER_EPHEMERAL"),
    ("env = {'PREFECT_UI_ENABLED': '0', 'PREFECT__SERVER_FINAL': '1'}", "private variable PREFECT__SERVER_FINAL"),
])
def test_the_checker_names_file_and_line_of_each_internal(snippet, expected):
    found = violations("import json\n" + snippet, "bad.py")
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(f"bad.py:{1 + len(snippet.splitlines())}:")  # the snippet's last line


def test_the_checker_accepts_the_public_surface():
    ok = textwrap.dedent("""
        import os
        import prefect
        from prefect import flow, get_client
        from prefect.blocks.core import Block
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect.workers.process import ProcessWorker
        from ._docs import DOCS_URL              # the project's own private names are its business
        from mlsys_flows.blocks import _docs

        class Store(Block):
            _block_type_name = "mlsys Store"     # what a block declares, as prefect-aws does
            _logo_url = None

        version = prefect.__version__
        os.environ["PREFECT_API_URL"] = "http://127.0.0.1:4200/api"
        template = ProcessWorker.get_default_base_job_template()
        other._private = 1                       # not a Prefect object
        """)
    assert violations(ok) == []
