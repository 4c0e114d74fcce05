"""The embodiedbench flow at smoke scale (the session's shared reference run): counted success per
level and per subset, with and without feedback, the expert upper bound, and the episodes on storage."""
import json
import math

from faultkit import reference_run

from mlsys_flows.systems.embodied import SUBSETS


def test_embodiedbench_flow_smoke(prefect_api):
    report, storage = reference_run("embodiedbench")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("success_rate", "no_feedback", "with_feedback", "counted")
    assert math.isfinite(h["ratio"]) or h["ratio"] == math.inf
    v, kinds = report["variants"], report["metric_kinds"]
    assert set(v) == {f"{a}{b}" for a in ("no_feedback", "with_feedback", "expert") for b in ("", "_high", "_low")}
    assert all(k == "counted" for k in kinds.values())
    per_subset = report["parameters"]["per_subset"]
    for name, m in v.items():
        assert m["episodes"] == per_subset * len(SUBSETS) * (1 if name.endswith(("_high", "_low")) else 2)
        assert 0.0 <= m["success_rate"] <= 1.0 and all(f"success_{s}" in m for s in SUBSETS)
        assert m["invalid_plans"] == 0.0   # the offline agents always reply with a well-formed plan
    assert v["expert"]["success_rate"] == 1.0
    assert v["no_feedback"]["plans_per_episode"] == 1.0 and v["with_feedback"]["plans_per_episode"] >= 1.0
    keys = [k for k in storage.list("runs/embodiedbench/") if k.endswith(".json") and "/episodes_" in k]
    assert len(keys) == 4   # two chunks per level
    eps = [e for k in keys for e in json.loads(storage.read_bytes(k))["with_feedback"]]
    assert len(eps) == v["with_feedback"]["episodes"] and all(e["reasons"] or e["success"] for e in eps)
    assert {r["baseline"] for r in report["ratios"]} >= {"no_feedback_high", "no_feedback_low", "with_feedback_low"}
