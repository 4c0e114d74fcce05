"""The three steps of a Llama run, each a plain function the flow's tasks call: profile the workers,
plan (reference answer, SLO, static baselines in hindsight), execute one variant for real."""
from __future__ import annotations

from . import Params, ops
from .pipeline import (LlamaOncePolicy, LlamaPolicy, Profile, RealRunner, StaticPolicy, choose_statics, execute, items_per_video,
                       make_jobs, measure_profile, plan_label, predict_run, profile_inputs, reference, scaled_profile)
from .runtime import WorkerPool

PROFILE_SEED_OFFSET = 1_000_003  # the profiling video is not one of the workload's
CALIBRATION_SEED_OFFSET = 2_000_003  # nor are the calibration videos the static plans are chosen on


def workload(p: Params, profiling: bool = False, calibration: bool = False, limit: int | None = None) -> list[list]:
    """The workload's videos, the (separate) profiling video, or the (separate) calibration videos."""
    seed = p.seed + (PROFILE_SEED_OFFSET if profiling else CALIBRATION_SEED_OFFSET if calibration else 0)
    n = 1 if profiling else p.calibration_videos if calibration else p.videos
    return [ops.make_video(seed, v, p.frames, p.frame_size, p.motion_share, p.object_rate)
            for v in range(min(n, limit or n))]


def jobs_of(p: Params, videos: list[list], calibration: bool = False):
    return make_jobs(videos, p.video_gap_s, p.seed + (CALIBRATION_SEED_OFFSET if calibration else 0))


def derive_slo(p: Params, jobs, profile: Profile, trace: dict) -> tuple[float, dict[str, float]]:
    """The SLO: slo_s, or slo_fraction between the slowest video's warm predicted latency under the
    fastest all-GPU and the cheapest all-CPU plan, plus slo_cold_starts x the slower tier's cold start
    (so a video that meets a cold start can still make it). Returns (SLO, those worst latencies)."""
    inf = float("inf")
    args = p.op_args()
    plans, _ = choose_statics(jobs, profile, trace, args, inf, inf, p.max_instances, 1.0, p.prewarm)
    worst = {name: max(v.latency_s for v in predict_run(jobs, StaticPolicy(name, plans[name], profile), profile, trace,
                                                          args, inf, inf, p.max_instances, p.prewarm).videos)
             for name in ("all_cpu", "all_gpu")}
    if p.slo_s is not None:
        return p.slo_s, worst
    return (worst["all_gpu"] + p.slo_fraction * max(0.0, worst["all_cpu"] - worst["all_gpu"])
            + p.slo_cold_starts * max(profile.cold_start_s.values())), worst


def policy_of(p: Params, name: str, plans: dict, profile: Profile):
    if name == "llama":
        return LlamaPolicy(profile, p.max_instances)
    if name == "llama_once":
        return LlamaOncePolicy(profile, p.max_instances)
    return StaticPolicy(name, plans[name], profile)


def regime_point(p: Params, profile: Profile, factor: float) -> dict[str, dict[str, float]]:
    """The operator duration / cold start regime at one point (modelled): every operation's profiled
    latency x ``factor``, cold starts unchanged; the SLO re-derived and the static plans re-chosen on
    the calibration videos with that profile, then Llama, its ablation and the deployable static plans
    predicted on the evaluated videos (the first ``regime_videos`` of each set)."""
    prof = scaled_profile(profile, factor)
    args = p.op_args()
    cal_videos = workload(p, calibration=True, limit=p.regime_videos)
    cal_trace, _ = reference(cal_videos, args)
    cal_jobs = jobs_of(p, cal_videos, calibration=True)
    slo, _ = derive_slo(p, cal_jobs, prof, cal_trace)
    plans, _ = choose_statics(cal_jobs, prof, cal_trace, args, slo, p.keep_alive_s, p.max_instances,
                              p.attainment_goal, p.prewarm)
    videos = workload(p, limit=p.regime_videos)
    trace, _ = reference(videos, args)
    jobs = jobs_of(p, videos)
    out = {}
    for name in ("best_static", "all_gpu", "llama", "llama_once"):
        out[name] = predict_run(jobs, policy_of(p, name, plans, prof), prof, trace, args, slo, p.keep_alive_s,
                                p.max_instances, p.prewarm).summary(slo)
    mean_op = sum(prof.lat(op, "cpu", prof.cheapest(op).batch) for op in ("decode", "sample", "motion", "detect",
                                                                            "classify")) / 5
    for m in out.values():
        m["op_over_cold_start"] = mean_op / max(prof.cold_start_s.values())
    return out


def run_profile(p: Params) -> dict:
    """Measure every (op, tier, batch size) on warm worker processes of each tier, and cold starts."""
    video = workload(p, profiling=True)
    inputs = profile_inputs(video, p.op_args(), max(p.batch_sizes))
    with WorkerPool(keep_alive_s=1e9, max_instances=p.cold_probes + 1) as pool:
        profile, details = measure_profile(pool, inputs, tuple(p.batch_sizes), p.op_args(), p.profile_reps,
                                           p.gpu_speedup(), p.prices(), p.cold_probes)
        profile.items_per_video = items_per_video(reference(video, p.op_args())[0], 1)
        details["cold_starts"] = pool.stats.cold_starts
        details["pids"] = list(pool.stats.pids)
    return {"profile": profile, **details}


def make_plan(p: Params, profile: Profile) -> dict:
    """The reference answer and trace, the SLO and the deployable static plans (both from the separate
    calibration videos), the static plan chosen in hindsight on the evaluated videos (static_oracle),
    and every plan's (and Llama's) predicted outcome on the evaluated videos."""
    args = p.op_args()
    cal_videos = workload(p, calibration=True)
    cal_trace, _ = reference(cal_videos, args)
    cal_jobs = jobs_of(p, cal_videos, calibration=True)
    # the SLO comes from warm predictions (no keep-alive expiry) on the calibration videos, plus cold starts
    slo, worst = derive_slo(p, cal_jobs, profile, cal_trace)
    plans, scored_cal = choose_statics(cal_jobs, profile, cal_trace, args, slo, p.keep_alive_s, p.max_instances,
                                       p.attainment_goal, p.prewarm)
    videos = workload(p)
    trace, answers = reference(videos, args)
    jobs = jobs_of(p, videos)
    hindsight, scored = choose_statics(jobs, profile, trace, args, slo, p.keep_alive_s, p.max_instances,
                                       p.attainment_goal, p.prewarm)
    plans["static_oracle"] = hindsight["best_static"]
    predicted = {name: predict_run(jobs, policy_of(p, name, plans, profile), profile, trace, args, slo,
                                   p.keep_alive_s, p.max_instances, p.prewarm).summary(slo)
                 for name in (*plans, "llama", "llama_once")}
    return {"slo_s": slo, "worst_predicted_s": worst, "plans": plans, "labels": {n: plan_label(pl) for n, pl in plans.items()},
            "answers": answers, "predicted": predicted, "candidates": len(scored),
            "frontier": sorted((c["slo_attainment"], c["cost"]) for c in scored)}


def run_variant(p: Params, name: str, plan: dict, profile: Profile) -> dict:
    """One variant over the whole workload on a fresh serverless pool of real worker processes."""
    videos = workload(p)
    jobs = jobs_of(p, videos)
    policy = policy_of(p, name, plan["plans"], profile)
    with WorkerPool(p.keep_alive_s, p.max_instances) as pool:
        for tier in ("cpu", "gpu"):   # provisioned concurrency: the same warm start for every variant
            pool.prewarm(tier, p.prewarm, 0.0)
        res = execute(jobs, policy, pool, RealRunner(p.gpu_speedup()), p.op_args(), plan["slo_s"], p.prices())
        pids = list(pool.stats.pids)
    summary = res.summary(plan["slo_s"])
    summary["answers_match"] = float(all(tuple(v.counts) == tuple(plan["answers"][v.video]) for v in res.videos))
    return {"metrics": summary, "latencies": [v.latency_s for v in res.videos], "configs": dict(res.configs),
            "pids": pids, "rtt_s": res.rtt_s}
