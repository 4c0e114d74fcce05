"""Contract v4, item 6: a flow body is its submit order. The spec declares every metric's kind and the
system's pure package assembles the SystemResult (metrics, samples, curves, notes) from the tasks'
outputs, so a flow module declares no kinds, writes no notes and builds no report parts."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from mlsys_flows.systems.common.report import SystemResult

FLOWS = Path(__file__).resolve().parents[2] / "flows"
REPORT_PARTS = {"SystemResult", "Curve", "RegimeSample", "Projection", "Assumption", "Ratio", "RunReport"}
REPORT_MODULES = ("systems.common.report", "systems.common.runreport")
# every field of the result a flow could set or change after build_result (notes, kinds, emulated,
# repeats, the regime's headline value, ...)
RESULT_FIELDS = {f.name for f in dataclasses.fields(SystemResult)}
# read freely: task names (t.regime) and parameters (p.repeats, p.samples); never set (below)
READ_OK = {"variants", "samples", "regime", "repeats"}
FORBIDDEN_NAMES = (RESULT_FIELDS - READ_OK) | {"setattr"}


def offences(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.endswith(REPORT_MODULES) or node.module.endswith("systems.common")
                and any(a.name in ("report", "runreport") for a in node.names)):
            found.append(f"line {node.lineno}: imports the report's parts ({node.module})")
        elif isinstance(node, ast.ImportFrom) and any(a.name in REPORT_PARTS for a in node.names):
            found.append(f"line {node.lineno}: imports a report part from {node.module}")
        elif isinstance(node, ast.Import) and any(a.name.endswith(REPORT_MODULES) for a in node.names):
            found.append(f"line {node.lineno}: imports the report's module")
        elif isinstance(node, ast.Name) and (node.id in FORBIDDEN_NAMES or node.id in REPORT_PARTS):
            found.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_NAMES or node.attr in REPORT_PARTS):
            found.append(f"line {node.lineno}: uses .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in FORBIDDEN_NAMES:
            found.append(f"line {node.lineno}: passes {node.arg}=")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                isinstance(t, ast.Attribute) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            found.append(f"line {node.lineno}: sets an attribute (a flow changes nothing its tasks returned)")
        elif isinstance(node, ast.Constant) and node.value in RESULT_FIELDS - READ_OK:
            found.append(f"line {node.lineno}: names the result field {node.value!r}")
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
    assert offences("import mlsys_flows.systems.common.report as R\nR.SystemResult(variants={})\n")
    assert offences("from mlsys_flows.systems.common import report\n")
    assert offences("from x import Curve as C\n")
    assert offences("res = build_result(p)\nres.repeats = None\n")
    assert offences("setattr(res, 'notes', [])\n")
    assert not offences("out = t.train.submit(p).result()\nreturn build_result(p, out)\n")
