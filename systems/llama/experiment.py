"""The three steps of a Llama run, each a plain function the flow's tasks call: profile the workers,
plan (reference answer, SLO, static baselines in hindsight), execute one variant for real."""
from __future__ import annotations

from . import Params, ops
from .pipeline import (LlamaPolicy, Profile, RealRunner, StaticPolicy, choose_statics, execute, items_per_video,
                       make_jobs, measure_profile, plan_label, predict_run, profile_inputs, reference)
from .runtime import WorkerPool

PROFILE_SEED_OFFSET = 1_000_003  # the profiling video is not one of the workload's


def workload(p: Params, profiling: bool = False) -> list[list]:
    """The workload's videos, or the (separate) profiling video."""
    seed = p.seed + PROFILE_SEED_OFFSET if profiling else p.seed
    return [ops.make_video(seed, v, p.frames, p.frame_size, p.motion_share, p.object_rate)
            for v in range(1 if profiling else p.videos)]


def jobs_of(p: Params, videos: list[list]):
    return make_jobs(videos, p.video_gap_s, p.seed)


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
    """The reference answer and trace, the SLO, the static plans chosen in hindsight, and every plan's
    (and Llama's) predicted outcome on this workload."""
    videos = workload(p)
    args = p.op_args()
    trace, answers = reference(videos, args)
    jobs = jobs_of(p, videos)
    inf = float("inf")
    # the SLO comes from warm predictions (no keep-alive expiry): content decides it, not cold starts
    plans, _ = choose_statics(jobs, profile, trace, args, inf, inf, p.max_instances, 1.0, p.prewarm)
    worst = {name: max(v.latency_s for v in predict_run(jobs, StaticPolicy(name, plans[name], profile), profile, trace,
                                                          args, inf, inf, p.max_instances, p.prewarm).videos)
             for name in ("all_cpu", "all_gpu")}
    slo = p.slo_s if p.slo_s is not None else \
        worst["all_gpu"] + p.slo_fraction * max(0.0, worst["all_cpu"] - worst["all_gpu"])
    plans, scored = choose_statics(jobs, profile, trace, args, slo, p.keep_alive_s, p.max_instances, p.attainment_goal,
                                   p.prewarm)
    predicted = {name: predict_run(jobs, StaticPolicy(name, plan, profile), profile, trace, args, slo, p.keep_alive_s,
                                   p.max_instances, p.prewarm).summary(slo) for name, plan in plans.items()}
    predicted["llama"] = predict_run(jobs, LlamaPolicy(profile, p.max_instances), profile, trace, args, slo,
                                     p.keep_alive_s, p.max_instances, p.prewarm).summary(slo)
    return {"slo_s": slo, "worst_predicted_s": worst, "plans": plans, "labels": {n: plan_label(pl) for n, pl in plans.items()},
            "answers": answers, "predicted": predicted, "candidates": len(scored),
            "frontier": sorted((c["slo_attainment"], c["cost"]) for c in scored)}


def run_variant(p: Params, name: str, plan: dict, profile: Profile) -> dict:
    """One variant over the whole workload on a fresh serverless pool of real worker processes."""
    videos = workload(p)
    jobs = jobs_of(p, videos)
    policy = LlamaPolicy(profile, p.max_instances) if name == "llama" else StaticPolicy(name, plan["plans"][name], profile)
    with WorkerPool(p.keep_alive_s, p.max_instances) as pool:
        for tier in ("cpu", "gpu"):   # provisioned concurrency: the same warm start for every variant
            pool.prewarm(tier, p.prewarm, 0.0)
        res = execute(jobs, policy, pool, RealRunner(p.gpu_speedup()), p.op_args(), plan["slo_s"], p.prices())
        pids = list(pool.stats.pids)
    summary = res.summary(plan["slo_s"])
    summary["answers_match"] = float(all(tuple(v.counts) == tuple(plan["answers"][v.video]) for v in res.videos))
    return {"metrics": summary, "latencies": [v.latency_s for v in res.videos], "configs": dict(res.configs),
            "pids": pids, "rtt_s": res.rtt_s}
