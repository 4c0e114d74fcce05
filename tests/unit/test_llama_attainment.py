"""Llama at equal attainment: enough evaluated videos at quick for attainment to move in small steps;
the verdict says whether a cost ratio is at equal attainment; the hindsight search for static_oracle
runs static plans cheapest-predicted first and takes the first that reaches Llama's attainment (runs
here: the executor on a profile, no mocks)."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.llama import SPEC, Params
from mlsys_flows.systems.llama import experiment as ex
from mlsys_flows.systems.llama.pipeline import (CHAIN, Profile, StaticPolicy, choose_statics, make_jobs, predict_run,
                                                reference)
from mlsys_flows.systems.llama.runtime import TIERS

BATCHES = (2, 8)


def profile() -> Profile:
    lat = {f"{op}/{t}": [1e-3 + (2e-3 if t == "cpu" else 4e-4) * b for b in BATCHES] for op in CHAIN for t in TIERS}
    return Profile(BATCHES, lat, {"cpu": 0.05, "gpu": 0.05}, {"cpu": 1.0, "gpu": 5.0},
                   {"decode": 16, "sample": 16, "motion": 8, "detect": 4, "classify": 8, "aggregate": 8})


def setup(slo: float):
    p = Params.for_scale("smoke", videos=4, frames=16)
    videos = ex.workload(p)
    trace, _ = reference(videos, p.op_args())
    jobs = make_jobs(videos, 0.2, p.seed)
    prof = profile()
    _, scored = choose_statics(jobs, prof, trace, p.op_args(), slo, 3.0, 1, 1.0)

    def run(cfg):
        return {"metrics": predict_run(jobs, StaticPolicy("s", cfg, prof), prof, trace, p.op_args(), slo, 3.0, 1)
                .summary(slo)}
    return ex.oracle_order(scored), run


def test_quick_evaluates_enough_videos_for_fine_attainment_steps():
    q = Params.for_scale("quick")
    assert q.videos >= 30 and q.calibration_videos >= 8
    assert "1 / videos" in Params.model_fields["videos"].description
    assert SPEC.roles["static_oracle"] == ("oracle",) and SPEC.headline.baseline == "best_static"


def test_verdict_lets_a_cost_ratio_stand_only_where_the_baseline_reaches_the_techniques_attainment():
    assert ex.attainment_verdict(0.9, 0.9, 40)["equal"] and ex.attainment_verdict(0.9, 0.9, 40, 0.5)["stands"]
    assert ex.attainment_verdict(1.0, 0.9, 40) == {"equal": False, "within": False, "stands": False, "step": 0.025,
                                                   "tolerance": 0.0, "technique": 1.0, "baseline": 0.9,
                                                   "videos_short": 0, "videos_over": 4, "baseline_ahead": False,
                                                   "technique_ahead": False}
    # the technique met more videos: the baseline did not reach its attainment, so neither a cost win (the
    # technique ahead on both: flagged, not counted) nor a cost loss (the baseline cheaper by missing
    # deadlines) stands
    ahead = ex.attainment_verdict(1.0, 0.9, 40, 1.3)
    assert not ahead["stands"] and ahead["technique_ahead"] and not ex.attainment_verdict(1.0, 0.9, 40, 0.8)["stands"]
    worse = ex.attainment_verdict(0.875, 0.925, 40, 1.5)
    assert not worse["equal"] and worse["videos_short"] == 2 and not worse["stands"]   # a win bought with misses
    assert ex.attainment_verdict(0.875, 0.925, 40, 0.7)["stands"]                     # behind on both: a loss
    assert ex.attainment_verdict(2 / 3, 5 / 6, 6)["videos_short"] == 1
    # within the tolerance two attainments count as equal, whichever side is cheaper; beyond it, not
    near = ex.attainment_verdict(31 / 32, 1.0, 32, 1.5, tolerance=0.05)
    assert near["within"] and near["stands"] and not near["equal"]
    assert not ex.attainment_verdict(30 / 32, 1.0, 32, 1.5, tolerance=0.05)["stands"]


def test_oracle_order_is_cheapest_predicted_first():
    order, _ = setup(0.5)
    assert [c["cost"] for c in order] == sorted(c["cost"] for c in order)
    assert len({c["label"] for c in order}) == len(order) == 2 * 2 * 2 * len(BATCHES)


def test_search_takes_the_first_plan_that_reaches_the_target():
    order, run = setup(0.5)
    att = [run(c["plan"])["metrics"]["slo_attainment"] for c in order]
    target = max(att)
    first = att.index(target)
    out = ex.search_oracle(order, run, target, tries=len(order))
    assert out["reached"] and out["candidate"]["label"] == order[first]["label"]
    assert len(out["tried"]) == first + 1 and out["run"]["metrics"]["slo_attainment"] == target
    assert all(t["slo_attainment"] < target for t in out["tried"][:-1])


def test_search_flags_a_target_it_cannot_reach_within_its_tries():
    order, run = setup(1e-4)      # an SLO no plan meets
    out = ex.search_oracle(order, run, 1.0, tries=3)
    assert not out["reached"] and len(out["tried"]) == 3
    assert out["candidate"]["label"] in {t["label"] for t in out["tried"]}
    with pytest.raises(ValueError):
        ex.search_oracle([], run, 1.0, 3)


def test_plan_keeps_the_oracle_out_of_the_deployable_plans():
    p = Params.for_scale("smoke", videos=2, calibration_videos=2, frames=16)
    plan = ex.make_plan(p, profile())
    assert set(plan["plans"]) == {"all_cpu", "all_gpu", "best_static"}
    assert len(plan["oracle_order"]) == plan["candidates"] and "static_oracle" not in plan["predicted"]
    assert set(plan["calibration"]) == {"llama", "all_cpu", "all_gpu", "best_static"}
