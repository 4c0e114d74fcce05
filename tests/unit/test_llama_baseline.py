"""Issue 47: Llama's static baseline is the cheapest static plan, all-CPU ones included, that reaches
Llama's own predicted attainment on the calibration videos, so cost is compared at equal attainment and
not at a goal (every deadline) that Llama itself misses. On a trace where all-CPU meets the SLO for as
many calibration videos as Llama, though not for all of them, and an all-GPU plan meets it for every one,
the baseline is the all-CPU plan; the selection before issue 47 (every calibration deadline) took the
all-GPU plan there and failed this test. The choice never sees the evaluated videos. Pure: the executor on
a constructed profile, no processes."""
from __future__ import annotations

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
    ok = [c for c in scored if c["slo_attainment"] >= att["llama"] - 1e-9]
    best = next(c for c in scored if c["plan"] is plans["best_static"])
    assert best in ok and best["cost"] == min(c["cost"] for c in ok)
    assert att["best_static"] == best["slo_attainment"] >= att["llama"]
    # cheaper plans exist only below Llama's attainment
    assert all(c["slo_attainment"] < att["llama"] for c in scored if c["cost"] < best["cost"])


def test_the_choice_never_sees_the_evaluated_videos():
    # the SLO derived too: it comes from the calibration videos alone
    small = {"calibration_videos": 2, "slo_s": None}
    a, b = ex.make_plan(params(**small), profile()), ex.make_plan(params(**small, videos=3), profile())
    assert a["slo_s"] == b["slo_s"] and a["labels"] == b["labels"] and a["calibration"] == b["calibration"]
    assert a["predicted"] != b["predicted"]   # the evaluated videos did change
