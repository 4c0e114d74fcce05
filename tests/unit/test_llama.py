"""Llama: the planner never picks a configuration it predicts will miss its target when a feasible one
exists, and takes the cheapest feasible one (property test; a deliberately broken planner fails it);
per-invocation targets split the remaining budget over the remaining critical path; the executor runs
the DAG with its branch and fan-out and every policy computes the reference answer; the ops and the
parameters are checked."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.llama import SPEC, Params, ops
from mlsys_flows.systems.llama import experiment as ex
from mlsys_flows.systems.llama.pipeline import (CHAIN, PLANNED, Config, Decision, LlamaPolicy, Profile, StaticPolicy,
                                                View, choose_statics, linear_fit, make_jobs, pick, predict,
                                                predict_run, reference, static_space)
from mlsys_flows.systems.llama.runtime import TIERS

BATCHES = (2, 8, 32)


def make_profile(overhead: dict, per_item: dict, cold=(0.3, 0.4), prices=(1.0, 5.0)) -> Profile:
    lat = {f"{op}/{t}": [overhead[t] + per_item[(op, t)] * b for b in BATCHES] for op in CHAIN for t in TIERS}
    return Profile(BATCHES, lat, dict(zip(TIERS, cold)), dict(zip(TIERS, prices)),
                   {"decode": 40, "sample": 40, "motion": 20, "detect": 10, "classify": 60, "aggregate": 60})


profiles = st.builds(
    lambda oc, og, items, cold, price: make_profile({"cpu": oc, "gpu": og}, dict(zip([(o, t) for o in CHAIN for t in TIERS], items)),
                                                    cold, (1.0, price)),
    st.floats(1e-4, 5e-3), st.floats(1e-4, 5e-3), st.lists(st.floats(1e-5, 5e-3), min_size=12, max_size=12),
    st.tuples(st.floats(0.05, 1.0), st.floats(0.05, 1.0)), st.floats(0.5, 20.0))
views = st.builds(lambda op, n, now, slack, ic, ig, sc, sg: View(op, n, now, now + slack, {"cpu": ic, "gpu": ig},
                                                                  {"cpu": sc, "gpu": sg}),
                  st.sampled_from(CHAIN), st.integers(1, 200), st.floats(0, 10), st.floats(-0.1, 1.0),
                  st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3))


def violates(choice: Decision, cands: list[Decision]) -> str | None:
    """Why ``choice`` breaks the planner's contract over ``cands`` (None: it keeps it)."""
    feasible = [c for c in cands if c.predicted_s <= c.target_s]
    if feasible:
        if choice.predicted_s > choice.target_s:
            return "picked a configuration predicted to miss its target although a feasible one exists"
        if choice.cost > min(c.cost for c in feasible) + 1e-15:
            return "a cheaper feasible configuration exists"
    elif choice.predicted_s > min(c.predicted_s for c in cands):
        return "nothing is feasible and a faster configuration exists"
    return None


def broken_pick(cands: list[Decision]) -> Decision:
    """A planner that forgets the target: always the cheapest configuration."""
    return min(cands, key=lambda c: c.cost)


@settings(max_examples=120, deadline=None)
@given(profile=profiles, view=views)
def test_planner_never_picks_a_predicted_miss_when_a_feasible_config_exists(profile, view):
    policy = LlamaPolicy(profile, max_instances=3)
    cands = policy.candidates(view)
    assert {c.config for c in cands} >= {Config(b, t) for t in TIERS for b in ((max(1, view.pending),) if view.op == "aggregate" else BATCHES)}
    choice = policy.choose(view)
    assert violates(choice, cands) is None
    assert choice.target_s == pytest.approx(policy.target(view))


def test_the_property_check_fails_on_a_broken_planner():
    # a tight target: the cheap CPU configuration misses it, the GPU one meets it
    profile = make_profile({"cpu": 1e-3, "gpu": 1e-3}, {(o, t): (2e-3 if t == "cpu" else 2e-4) for o in CHAIN for t in TIERS},
                           prices=(1.0, 20.0))
    view = View("classify", 64, 0.0, 0.05, {"cpu": 2, "gpu": 2}, {"cpu": 0, "gpu": 0})
    cands = LlamaPolicy(profile, 2).candidates(view)
    assert any(c.predicted_s <= c.target_s for c in cands)
    assert violates(pick(cands), cands) is None
    assert "predicted to miss" in violates(broken_pick(cands), cands)
    # and on random inputs the broken planner is caught too
    rng = np.random.default_rng(0)
    caught = 0
    for _ in range(200):
        prof = make_profile({"cpu": rng.uniform(1e-4, 5e-3), "gpu": rng.uniform(1e-4, 5e-3)},
                            {(o, t): rng.uniform(1e-5, 5e-3) for o in CHAIN for t in TIERS}, prices=(1.0, rng.uniform(0.5, 20)))
        v = View(str(rng.choice(PLANNED)), int(rng.integers(1, 200)), 0.0, float(rng.uniform(0, 0.3)),
                 {"cpu": 2, "gpu": 2}, {"cpu": 0, "gpu": 0})
        cs = LlamaPolicy(prof, 2).candidates(v)
        caught += violates(broken_pick(cs), cs) is not None
    assert caught > 10


def test_targets_split_the_remaining_budget_over_the_remaining_path():
    profile = make_profile({"cpu": 1e-3, "gpu": 1e-3}, {(o, t): 1e-3 for o in CHAIN for t in TIERS})
    policy = LlamaPolicy(profile, max_instances=2)
    idle = {"cpu": 2, "gpu": 2}
    first = View("decode", 40, 0.0, 1.0, idle, {"cpu": 0, "gpu": 0})
    mine, path = policy.shares("decode", 40)
    assert policy.target(first) == pytest.approx(mine / path)
    # a later stage splits what is left with the stages after it; a late invocation gets nothing
    last = View("classify", 60, 0.5, 1.0, idle, {"cpu": 0, "gpu": 0})
    mine, path = policy.shares("classify", 60)
    assert 0 < mine < path and policy.target(last) == pytest.approx(0.5 * mine / path)
    assert policy.target(View("detect", 5, 2.0, 1.0, idle, {"cpu": 0, "gpu": 0})) == 0.0
    # cold starts and waves enter the prediction; with no instance anywhere nothing is predicted to run
    v = View("classify", 64, 0.0, 1.0, {"cpu": 0, "gpu": 1}, {"cpu": 2, "gpu": 0})
    lat_cpu, _, scale_cpu = predict(profile, "classify", Config(32, "cpu"), v)
    lat_gpu, _, scale_gpu = predict(profile, "classify", Config(32, "gpu"), v)
    assert scale_cpu and lat_cpu == pytest.approx(0.3 + profile.lat("classify", "cpu", 32))
    assert not scale_gpu and lat_gpu == pytest.approx(2 * profile.lat("classify", "gpu", 32))
    assert math.isinf(predict(profile, "classify", Config(8, "cpu"), View("classify", 9, 0, 1, {"cpu": 0, "gpu": 0},
                                                                          {"cpu": 0, "gpu": 0}))[0])


def test_linear_fit_smooths_noise():
    fit = linear_fit(BATCHES, [3e-3, 1e-3, 9e-3])   # a noisy small batch
    assert all(a <= b for a, b in zip(fit, fit[1:]))
    assert all(fit[i] / BATCHES[i] >= fit[i + 1] / BATCHES[i + 1] for i in range(2))


def test_ops_branch_fan_out_and_batch_invariance():
    p = Params.for_scale("smoke")
    args = p.op_args()
    video = ops.make_video(0, 0, 16, 128, 1.0, 0.6)
    assert video == ops.make_video(0, 0, 16, 128, 1.0, 0.6)      # seeded
    frames = ops.decode(video, args)
    kept = ops.sample(frames, args)
    assert [k for k, _ in kept] == list(range(0, 16, p.sample_rate)) and kept[0][1].shape == (64, 64)
    still = ops.motion([(2, (kept[0][1], kept[0][1]))], args)
    assert still == []                                            # the branch not taken: no motion
    crops = ops.detect(kept, args)
    per_frame = {k: sum(1 for (f, _), _ in crops if f == k) for k, _ in kept}
    assert len(set(per_frame.values())) >= 1 and sum(per_frame.values()) > 0
    one_by_one = [lab for c in crops for lab in ops.classify([c], args)]
    assert ops.classify(crops, args) == one_by_one               # batching does not change the answer
    counts = ops.aggregate(one_by_one, {**args, "video": 3})
    assert counts[0][0] == 3 and sum(counts[0][1]) == len(crops)


def test_executor_predicted_every_policy_computes_the_answer():
    p = Params.for_scale("smoke", videos=3, frames=16)
    videos = ex.workload(p)
    trace, answers = reference(videos, p.op_args())
    profile = make_profile({"cpu": 1e-3, "gpu": 1e-3}, {(o, t): (2e-3 if t == "cpu" else 4e-4) for o in CHAIN for t in TIERS})
    jobs = make_jobs(videos, 0.5, p.seed)
    assert [j.arrival for j in jobs][0] == 0.0 and all(a <= b for a, b in zip([j.arrival for j in jobs], [j.arrival for j in jobs][1:]))
    plans, scored = choose_statics(jobs, profile, trace, p.op_args(), 1.0, 3.0, 2, 1.0)
    assert len(scored) == len(list(static_space(BATCHES))) == 24
    assert all(c.tier == "cpu" for c in plans["all_cpu"].values()) and all(c.tier == "gpu" for c in plans["all_gpu"].values())
    for name, policy in [*((n, StaticPolicy(n, pl, profile)) for n, pl in plans.items()), ("llama", LlamaPolicy(profile, 2))]:
        res = predict_run(jobs, policy, profile, trace, p.op_args(), 0.2, 3.0, 2)
        assert [v.video for v in res.videos] == [0, 1, 2]
        assert {v.video: v.counts for v in res.videos} == answers, name
        assert sum(v.objects for v in res.videos) == sum(sum(a) for a in answers.values())
        assert all(v.latency_s > 0 and v.met == (v.latency_s <= 0.2) for v in res.videos)
        assert res.cost == pytest.approx(sum(v.cost for v in res.videos))
    # the hindsight best static plan is the cheapest one predicted to meet the goal
    ok = [c for c in scored if c["slo_attainment"] >= 1.0]
    if ok:
        assert min(c["cost"] for c in ok) == pytest.approx(
            predict_run(jobs, StaticPolicy("b", plans["best_static"], profile), profile, trace, p.op_args(), 1.0, 3.0, 2)
            .summary(1.0)["cost"])


def test_params_are_validated():
    for bad, field in [({"frame_size": 100}, "frame_size"), ({"batch_sizes": [8, 2]}, "batch_sizes"),
                       ({"prewarm": 5, "max_instances": 2}, "prewarm"), ({"videos": 0}, "videos"),
                       ({"cpu_price_per_s": -1.0}, "cpu_price_per_s")]:
        with pytest.raises(ParamsError) as err:
            Params.for_scale("smoke", **bad)
        assert field in str(err.value) or err.value.field in (field, "parameters")
    assert SPEC.headline.metric == "cost" and SPEC.headline.baseline == "best_static" and SPEC.headline.technique == "llama"
    assert SPEC.role("all_cpu") == ("deployable",)   # chosen on the calibration videos, compared by the harness
