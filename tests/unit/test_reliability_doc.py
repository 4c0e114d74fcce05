"""docs/reliability.md names only tests that exist, and names every reliability test."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
# the reliability suite: every test in these files must appear in the table
OWN = ["tests/unit/test_bad_inputs.py", "tests/flows/test_bad_inputs_flow.py",
       "tests/integration/test_worker_faults.py", "tests/integration/test_flow_crash_resume.py",
       "tests/integration/test_storage_faults.py", "tests/integration/test_secrets.py",
       # the attacks (issue 35)
       "tests/unit/test_fpga_isolation.py", "tests/unit/test_webhook_replays.py", "tests/unit/test_binding.py",
       "tests/integration/test_webhooks.py"]


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test_")}


def _named() -> set[tuple[str, str]]:
    return set(re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", DOC.read_text()))


def test_every_test_in_the_table_exists():
    named = _named()
    assert len(named) >= 20
    missing = [f"{f}::{t}" for f, t in sorted(named) if not (ROOT / f).exists() or t not in _tests_in(ROOT / f)]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


def test_every_reliability_test_is_in_the_table():
    named = _named()
    absent = [f"{f}::{t}" for f in OWN for t in sorted(_tests_in(ROOT / f)) if (f, t) not in named]
    assert not absent, f"add these tests to docs/reliability.md: {absent}"
