"""The embodiedbench flow at smoke scale (the session's shared reference run): counted success per
level and per subset, with and without feedback (one plan, and the same plan budget), the scripted
reference (at the step budget), ERA's learned policies (masked, as trained), each claim's floor (random plans
for the language agent's, a random valid action per step for ERA's) and the comparisons at it (no verdict), the expert upper bound, one sample per test set, the round-budget regime, the
components, and the episodes on storage."""
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
    agents = ("no_feedback", "with_feedback", "replan_no_feedback", "expert", "scripted_no_feedback",
              "scripted_with_feedback", "scripted_replan_no_feedback", "random_plan", "random_valid", "era_prior",
              "era_prior_rl")
    assert set(v) == {f"{a}{b}" for a in agents for b in ("", "_high", "_low")}
    assert all(k == "counted" for k in kinds.values())
    per_subset, seeds = report["parameters"]["per_subset"], report["parameters"]["seeds"]
    for name, m in v.items():
        assert m["episodes"] == seeds * per_subset * len(SUBSETS) * (1 if name.endswith(("_high", "_low")) else 2)
        assert 0.0 <= m["success_rate"] <= 1.0 and all(f"success_{s}" in m for s in SUBSETS)
        assert m["invalid_plans"] == 0.0   # the offline agents always reply with a well-formed plan
    assert v["expert"]["success_rate"] == 1.0
    assert v["no_feedback"]["plans_per_episode"] == 1.0 and v["with_feedback"]["plans_per_episode"] >= 1.0
    assert v["replan_no_feedback"]["plans_per_episode"] > 1.0
    # smoke: the scripted planner plays the headline's protocols; its reference replans until the step budget
    assert report["parameters"]["agent"] == "scripted" and v["no_feedback"] == v["scripted_no_feedback"]
    assert v["scripted_with_feedback"]["plans_per_episode"] >= v["with_feedback"]["plans_per_episode"]
    # ERA's policies play step by step (one action per plan), masked as trained: never an invalid action
    assert v["era_prior_rl"]["invalid_actions_per_episode"] == 0.0
    assert v["era_prior_rl"]["plans_per_episode"] == v["era_prior_rl"]["steps_per_episode"]
    # their floor: a random valid action per step, never an invalid one, up to the step budget
    assert v["random_valid"]["invalid_actions_per_episode"] == 0.0
    assert v["random_valid"]["plans_per_episode"] == v["random_valid"]["steps_per_episode"]
    # agent=scripted: the scripted planner plays every protocol, so only ERA's claims can decide; of those, a
    # comparison whose both sides are at or below its floor gets no verdict (against the floor itself: both 0)
    for r in [h, h["vs_strongest"], h["mechanism"], *report["ratios"]]:
        why, tech, base = r["verdict"]["why"], r["technique"], r["baseline"]
        if not tech.startswith("era_"):
            assert why.startswith("undecidable: reference"), (tech, base, why)
            continue
        assert not why.startswith("undecidable: reference"), (tech, base, why)
        t, b = (v[tech]["success_rate"], v[base]["success_rate"])
        floor = {x: v["random_valid" + ("_" + x.rsplit("_", 1)[1] if x.endswith(("_high", "_low")) else "")]
                 ["success_rate"] for x in (tech, base)}
        at = t == b == 0.0 if base.startswith("random_valid") else t <= floor[tech] and b <= floor[base]
        assert why.startswith("undecidable: at the floor") == at, (tech, base, why)
    keys = [k for k in storage.list(f"runs/embodiedbench/{report['run_id']}/") if "/episodes_" in k]
    era_keys = [k for k in keys if "/episodes_era_" in k]
    assert len(era_keys) == 2 and len(keys) == 2 * seeds + 2   # one chunk per level and test set, ERA per level
    eps = [e for k in keys if k not in era_keys for e in json.loads(storage.read_bytes(k))["with_feedback"]]
    assert len(eps) == v["with_feedback"]["episodes"] and all(e["reasons"] or e["success"] for e in eps)
    assert {r["baseline"] for r in report["ratios"]} >= {"no_feedback", "replan_no_feedback_high", "with_feedback_low",
                                                         "era_prior_rl_low", "scripted_replan_no_feedback"}
    assert {c["name"]: c["provenance"] for c in report["components"]}["SmolLM2-135M-Instruct"] == "learned"
    assert {"learned", "scripted"} <= {c["provenance"] for c in report["components"]}
    # contract v3: one success sample per test set, feedback isolated at the same plan budget, the budget swept
    assert len(report["samples"]["with_feedback"]["success_rate"]) == seeds == 2 and h["range"] is not None
    assert h["mechanism"]["baseline"] == "replan_no_feedback" and h["vs_strongest"]["baseline"] == "replan_no_feedback"
    # every closed-loop protocol makes the open-loop plan first, so it never does worse than one plan
    assert min(v["with_feedback"]["success_rate"], v["replan_no_feedback"]["success_rate"]) >= v["no_feedback"]["success_rate"]
    g = report["regime"]
    assert g["parameter"] == "max_rounds" and [p["value"] for p in g["points"]] == [1.0, 2.0]
    assert g["headline_value"] == 2.0 and all(p["kind"] == "counted" and p["repeats"] == 2 for p in g["points"])
    assert g["points"][-1]["ratio"] == h["ratio"]   # the full budget is the headline's own episodes
