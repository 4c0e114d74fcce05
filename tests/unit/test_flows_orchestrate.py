"""Contract v4, item 6: a flow body is its submit order. The spec declares every metric's kind and the
system's pure package assembles the SystemResult (metrics, samples, curves, notes) from the tasks'
outputs, so a flow module declares no kinds, writes no notes and builds no report parts."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

FLOWS = Path(__file__).resolve().parents[2] / "flows"
REPORT_PARTS = {"SystemResult", "Curve", "RegimeSample", "Projection", "Assumption"}
FORBIDDEN_NAMES = {"kinds", "notes"}


def offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("systems.common.report"):
            found.append(f"line {node.lineno}: imports the report's parts ({node.module})")
        elif isinstance(node, ast.Name) and (node.id in FORBIDDEN_NAMES or node.id in REPORT_PARTS):
            found.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"line {node.lineno}: uses .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in FORBIDDEN_NAMES:
            found.append(f"line {node.lineno}: passes {node.arg}=")
    return found


@pytest.mark.parametrize("path", sorted(p for p in FLOWS.glob("*.py") if p.stem not in ("__init__", "common")),
                         ids=lambda p: p.stem)
def test_a_flow_only_orchestrates(path):
    assert offences(path.read_text()) == [], \
        f"{path.name} declares kinds, writes notes or builds report parts: move them to systems/{path.stem}/"


def test_the_check_can_fail():
    assert offences("kinds = {'t': 'measured'}\n")
    assert offences("r.notes.append('x')\n")
    assert offences("from mlsys_flows.systems.common.report import Curve\n")
    assert offences("SystemResult(variants={}, kinds={})\n")
    assert not offences("out = t.train.submit(p).result()\nreturn build_result(p, out)\n")
