"""Issue 47: Llama's static baseline is the cheapest static plan, all-CPU ones included, that reaches
Llama's own predicted attainment on the calibration videos, so cost is compared at equal attainment and
not at a goal (every deadline) that Llama itself misses. On a trace where all-CPU meets the SLO for as
many calibration videos as Llama, though not for all of them, and an all-GPU plan meets it for every one,
the baseline is the all-CPU plan; the selection before issue 47 (every calibration deadline) took the
all-GPU plan there and failed this test. Llama's predicted attainment is reached itself, no tolerance
subtracted (the review of issue 47, M1: a plan picked at the tolerance band's bottom edge fell below it on
the evaluated videos and the harness's constraint left only all-GPU to compare with), and no
static plan (all_cpu and all_gpu included) is as cheap and at least as good on the calibration videos as
best_static: it is never a dominated plan there. The choice never sees the evaluated videos. Pure: the
executor on a constructed profile, no processes."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.llama import Params
from mlsys_flows.systems.llama import experiment as ex
from mlsys_flows.systems.llama.pipeline import CHAIN, Profile, reference
from mlsys_flows.systems.llama.runtime import TIERS

BATCHES = (2, 8)
CAL, SLO = 6, 0.1075   # the middle of the SLOs (0.105 to 0.11 s) at which the trace is the one the issue names
PER_ITEM = {"decode": 1e-4, "sample": 1e-4, "motion": 1e-4, "detect": 2e-3, "classify": 1e-3, "aggregate": 1e-4}
GPU_SPEEDUP = {"detect": 10.0, "classify": 10.0}   # light ops run as fast on either tier


def profile() -> Profile:
    """detect and classify ten times faster on the GPU tier at twenty times the price (so the GPU is never
    the cheaper tier); the same cold start on both tiers; the planner's expected items per op near the
    calibration videos' mean."""
    lat = {f"{op}/{t}": [1e-3 + PER_ITEM[op] / (GPU_SPEEDUP.get(op, 1.0) if t == "gpu" else 1.0) * b for b in BATCHES]
           for op in CHAIN for t in TIERS}
    return Profile(BATCHES, lat, {"cpu": 0.05, "gpu": 0.05}, {"cpu": 1.0, "gpu": 20.0},
                   {"decode": 16, "sample": 16, "motion": 8, "detect": 5, "classify": 44, "aggregate": 44})


def params(**kw) -> Params:
    # smoke: no provisioned instances, so the first calibration video meets cold workers
    return Params.for_scale("smoke", **{"videos": 2, "calibration_videos": CAL, "frames": 16, "slo_s": SLO, **kw})


def test_all_cpu_is_the_baseline_where_it_does_as_well_as_llama_on_the_calibration_videos():
    plan = ex.make_plan(params(), profile())
    assert plan["plans"]["best_static"] == plan["plans"]["all_cpu"], plan["labels"]
    cal = plan["calibration"]
    # the trace is the one the issue names: all-CPU as good as Llama there, yet not every deadline met
    assert cal["llama"] <= cal["all_cpu"] < 1.0
    # an all-GPU plan meets every calibration deadline: a goal of every deadline would have taken it
    assert cal["all_gpu"] == 1.0


def test_best_static_is_the_cheapest_plan_reaching_llamas_predicted_attainment():
    p = params()
    cal_videos = ex.workload(p, calibration=True)
    trace, _ = reference(cal_videos, p.op_args())
    jobs = ex.jobs_of(p, cal_videos, calibration=True)
    plans, att, scored = ex.deployable_plans(p, jobs, profile(), trace, SLO)
    target = att["llama"]   # no tolerance subtracted
    ok = [c for c in scored if c["slo_attainment"] >= target - 1e-9]
    best = next(c for c in scored if c["plan"] is plans["best_static"])
    assert best in ok and best["cost"] == min(c["cost"] for c in ok)
    assert att["best_static"] == best["slo_attainment"] >= target
    # cheaper plans exist only below Llama's attainment
    assert all(c["slo_attainment"] < target for c in scored if c["cost"] < best["cost"])


def dominated_by(best: dict, scored: list[dict]) -> list[dict]:
    """The scored plans at most as dear and at least as good as ``best``, better in one."""
    return [c for c in scored if c is not best and c["cost"] <= best["cost"] and c["slo_attainment"] >= best["slo_attainment"]
            and (c["cost"] < best["cost"] or c["slo_attainment"] > best["slo_attainment"])]


@pytest.mark.parametrize("slo", [0.09, SLO, 0.13, 0.2])
@pytest.mark.parametrize("tolerance", [0.0, 0.2])
def test_best_static_is_never_dominated_by_another_deployable_plan_on_the_calibration_videos(slo, tolerance):
    # SLOs from ones no plan meets everywhere to ones every plan meets; with and without a tolerance
    p = params(attainment_tolerance=tolerance)
    cal_videos = ex.workload(p, calibration=True)
    trace, _ = reference(cal_videos, p.op_args())
    jobs = ex.jobs_of(p, cal_videos, calibration=True)
    plans, att, scored = ex.deployable_plans(p, jobs, profile(), trace, slo)
    best = next(c for c in scored if c["plan"] is plans["best_static"])
    assert not dominated_by(best, scored), (slo, tolerance, [c["slo_attainment"] for c in scored])
    # all_cpu and all_gpu (the other deployable plans) are among the scored ones
    for name in ("all_cpu", "all_gpu"):
        other = next(c for c in scored if c["plan"] is plans[name])
        assert not (other["cost"] <= best["cost"] and other["slo_attainment"] >= best["slo_attainment"]
                    and (other["cost"], other["slo_attainment"]) != (best["cost"], best["slo_attainment"]))
    # and where all-CPU reaches Llama's attainment, best_static costs at most all_cpu
    if att["all_cpu"] >= att["llama"] - 1e-9:
        assert best["cost"] <= next(c for c in scored if c["plan"] is plans["all_cpu"])["cost"]


def test_the_tolerance_does_not_lower_the_calibration_target_all_cpu_one_video_short_is_not_the_baseline():
    """M1 (the review of issue 47): on the six calibration videos at a tight SLO, all-CPU meets one video fewer
    than Llama is predicted to. With the target lowered by a tolerance of one video's step (before), all-CPU
    was the baseline, picked at the band's bottom edge; now the target is Llama's attainment whatever the
    tolerance, so a dearer plan reaching it is, the same one as with no tolerance."""
    p0, p1 = params(attainment_tolerance=0.0), params(attainment_tolerance=1 / CAL)
    cal_videos = ex.workload(p0, calibration=True)
    trace, _ = reference(cal_videos, p0.op_args())
    jobs = ex.jobs_of(p0, cal_videos, calibration=True)
    for slo in (0.09, 0.095, 0.1, 0.105):
        plans0, att, scored = ex.deployable_plans(p0, jobs, profile(), trace, slo)
        if abs(att["llama"] - att["all_cpu"] - 1 / CAL) > 1e-9:
            continue
        plans1, att1, _ = ex.deployable_plans(p1, jobs, profile(), trace, slo)
        assert plans0["best_static"] != plans0["all_cpu"] and plans1["best_static"] != plans1["all_cpu"]
        assert plans1["best_static"] == plans0["best_static"] and att1["best_static"] >= att1["llama"] - 1e-9
        return
    pytest.skip("no SLO in the list makes all-CPU miss exactly one calibration video more than Llama")
