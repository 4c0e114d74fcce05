"""The embodiedbench flow at smoke scale (the session's shared reference run): counted success per
level and per subset, with and without feedback (one plan, and the same plan budget), the expert upper
bound, one sample per test set, the round-budget regime, and the episodes on storage."""
import json
import math

from faultkit import reference_run

from mlsys_flows.systems.embodied import SUBSETS


def test_embodiedbench_flow_smoke(prefect_api):
    report, storage = reference_run("embodiedbench")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == \
        ("success_rate", "replan_no_feedback", "with_feedback", "counted")
    assert math.isfinite(h["ratio"]) or h["ratio"] == math.inf
    v, kinds = report["variants"], report["metric_kinds"]
    assert set(v) == {f"{a}{b}" for a in ("no_feedback", "with_feedback", "replan_no_feedback", "expert")
                      for b in ("", "_high", "_low")}
    assert all(k == "counted" for k in kinds.values())
    per_subset, seeds = report["parameters"]["per_subset"], report["parameters"]["seeds"]
    for name, m in v.items():
        assert m["episodes"] == seeds * per_subset * len(SUBSETS) * (1 if name.endswith(("_high", "_low")) else 2)
        assert 0.0 <= m["success_rate"] <= 1.0 and all(f"success_{s}" in m for s in SUBSETS)
        assert m["invalid_plans"] == 0.0   # the offline agents always reply with a well-formed plan
    assert v["expert"]["success_rate"] == 1.0
    assert v["no_feedback"]["plans_per_episode"] == 1.0 and v["with_feedback"]["plans_per_episode"] >= 1.0
    assert v["replan_no_feedback"]["plans_per_episode"] > 1.0
    keys = [k for k in storage.list(f"runs/embodiedbench/{report['run_id']}/") if "/episodes_" in k]
    assert len(keys) == 2 * seeds   # one chunk per level and test set
    eps = [e for k in keys for e in json.loads(storage.read_bytes(k))["with_feedback"]]
    assert len(eps) == v["with_feedback"]["episodes"] and all(e["reasons"] or e["success"] for e in eps)
    assert {r["baseline"] for r in report["ratios"]} >= {"no_feedback", "replan_no_feedback_high", "with_feedback_low"}
    # contract v3: one success sample per test set, feedback isolated at the same plan budget, the budget swept
    assert len(report["samples"]["with_feedback"]["success_rate"]) == seeds == 2 and h["range"] is not None
    assert h["mechanism"]["baseline"] == "replan_no_feedback" and h["vs_strongest"]["baseline"] == "replan_no_feedback"
    # every closed-loop protocol makes the open-loop plan first, so it never does worse than one plan
    assert min(v["with_feedback"]["success_rate"], v["replan_no_feedback"]["success_rate"]) >= v["no_feedback"]["success_rate"]
    g = report["regime"]
    assert g["parameter"] == "max_rounds" and [p["value"] for p in g["points"]] == [2.0, 10.0]
    assert g["headline_value"] == 10.0 and all(p["kind"] == "counted" and p["repeats"] == 2 for p in g["points"])
    assert g["points"][-1]["ratio"] == h["ratio"]   # the full budget is the headline's own episodes
