"""The steps of a Llama run, each a plain function the flow's tasks call: profile the workers,
plan (reference answers, SLO and deployable static plans on calibration videos: best_static reaches
Llama's own predicted attainment there, no tolerance subtracted), execute one variant for real
on one repeat's videos (repeat r: videos and arrivals of seed + r), and search in hindsight for the
cheapest static plan reaching Llama's measured attainment on repeat 0's videos (static_oracle)."""
from __future__ import annotations

import math
import statistics

from . import Params, ops
from .pipeline import (LlamaOncePolicy, LlamaPolicy, Profile, RealRunner, StaticPolicy, choose_statics, execute, items_per_video,
                       make_jobs, measure_profile, plan_label, predict_run, profile_inputs, reference, scaled_profile)
from .runtime import WorkerPool

PROFILE_SEED_OFFSET = 1_000_003  # the profiling video is not one of the workload's
CALIBRATION_SEED_OFFSET = 2_000_003  # nor are the calibration videos the static plans are chosen on


def workload(p: Params, profiling: bool = False, calibration: bool = False, limit: int | None = None,
             repeat: int = 0) -> list[list]:
    """Repeat ``repeat``'s evaluated videos (seed + repeat, as swarm's and metropolis's repeats draw
    their workloads: the repeats are independent pairs over workloads, not reruns of one), the
    (separate) profiling video, or the (separate) calibration videos (one set, whatever the repeat)."""
    seed = p.seed + (PROFILE_SEED_OFFSET if profiling else CALIBRATION_SEED_OFFSET if calibration else repeat)
    n = 1 if profiling else p.calibration_videos if calibration else p.videos
    return [ops.make_video(seed, v, p.frames, p.frame_size, p.motion_share, p.object_rate)
            for v in range(min(n, limit or n))]


def jobs_of(p: Params, videos: list[list], calibration: bool = False, repeat: int = 0):
    """The videos' Poisson arrivals: repeat ``repeat``'s own (seed + repeat), or the calibration set's."""
    return make_jobs(videos, p.video_gap_s, p.seed + (CALIBRATION_SEED_OFFSET if calibration else repeat))


def derive_slo(p: Params, jobs, profile: Profile, trace: dict) -> tuple[float, dict[str, float]]:
    """The SLO: slo_s, or slo_fraction between the slowest video's warm predicted latency under the
    fastest all-GPU and the cheapest all-CPU plan, plus slo_cold_starts x the slower tier's cold start
    (so a video that meets a cold start can still make it). Returns (SLO, those worst latencies)."""
    inf = float("inf")
    args = p.op_args()
    # an infinite SLO: every plan meets it, only all_cpu and all_gpu are used
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


def deployable_plans(p: Params, jobs, profile: Profile, trace: dict, slo: float) -> tuple[dict, dict[str, float], list[dict]]:
    """The deployable static plans, chosen on calibration ``jobs`` (never the evaluated videos): all_cpu,
    all_gpu and best_static, the cheapest static plan (all-CPU ones included) predicted to meet the SLO for
    at least Llama's own predicted share of these videos (no tolerance subtracted: picked at the bottom edge
    of the tolerance band, a plan tends to fall below it on the evaluated videos, where the harness's
    constraint holds it to Llama's attainment less ``attainment_tolerance``), so that cost is compared at
    equal attainment. No other scored plan, all_cpu
    and all_gpu included, is as cheap and at least as good on these videos (``choose_statics``): where
    all-CPU reaches the target, best_static is all-CPU or a cheaper plan. Returns the plans, the predicted
    attainment on these videos of Llama and of each plan, and every scored plan. Llama's prediction cannot
    be missing: a run the executor cannot finish raises here, and Llama's real run would not finish either."""
    args = p.op_args()
    # Llama predicted by the same executor, profile and trace that score the static plans
    llama = predict_run(jobs, LlamaPolicy(profile, p.max_instances), profile, trace, args, slo, p.keep_alive_s,
                        p.max_instances, p.prewarm).summary(slo)["slo_attainment"]
    # Llama's predicted attainment itself, no tolerance subtracted (the review of issue 47, M1): a plan picked at
    # the band's bottom edge on calibration falls below it on the evaluated videos about half the time, the
    # harness's constraint then excludes it and only all-GPU, the dearest plan, is left to compare with
    plans, scored = choose_statics(jobs, profile, trace, args, slo, p.keep_alive_s, p.max_instances,
                                   llama, p.prewarm)
    att = {"llama": llama, **{n: next(c["slo_attainment"] for c in scored if c["plan"] is pl) for n, pl in plans.items()}}
    return plans, att, scored


def regime_sets(p: Params) -> dict:
    """The videos every regime point predicts, computed once for the sweep: every calibration video
    (the SLO and the plans are re-chosen on the same set as the headline's) and the first
    ``regime_videos`` evaluated videos of repeat 0, each with its trace and arrivals."""
    args = p.op_args()
    cal_videos, videos = workload(p, calibration=True), workload(p, limit=p.regime_videos)
    # predictions only: no answer is checked, so the classifier need not run
    return {"cal_trace": reference(cal_videos, args, labels=False)[0],
            "cal_jobs": jobs_of(p, cal_videos, calibration=True),
            "trace": reference(videos, args, labels=False)[0], "jobs": jobs_of(p, videos)}


def regime_point(p: Params, profile: Profile, factor: float, sets: dict | None = None) -> dict[str, dict[str, float]]:
    """The operator duration / cold start regime at one point (modelled): every operation's profiled
    latency x ``factor``, cold starts unchanged; the SLO re-derived and the static plans re-chosen on
    the calibration videos with that profile by the headline's rule (``deployable_plans``), then Llama,
    its ablation and the deployable static plans predicted on the first ``regime_videos`` evaluated
    videos (``sets``: ``regime_sets(p)``, computed here when not given). Each variant's
    ``calibration_slo_attainment``: its predicted attainment on the calibration videos (NaN for
    llama_once, which no plan is chosen against)."""
    prof = scaled_profile(profile, factor)
    args = p.op_args()
    sets = sets or regime_sets(p)
    cal_trace, cal_jobs, trace, jobs = sets["cal_trace"], sets["cal_jobs"], sets["trace"], sets["jobs"]
    slo, _ = derive_slo(p, cal_jobs, prof, cal_trace)
    plans, cal_att, _ = deployable_plans(p, cal_jobs, prof, cal_trace, slo)
    out = {}
    for name in ("best_static", "all_gpu", "all_cpu", "llama", "llama_once"):
        out[name] = predict_run(jobs, policy_of(p, name, plans, prof), prof, trace, args, slo, p.keep_alive_s,
                                p.max_instances, p.prewarm).summary(slo)
        out[name]["calibration_slo_attainment"] = cal_att.get(name, math.nan)
    mean_op = sum(prof.lat(op, "cpu", prof.cheapest(op).batch) for op in ("decode", "sample", "motion", "detect",
                                                                            "classify")) / 5
    for m in out.values():
        m["op_over_cold_start"] = mean_op / max(prof.cold_start_s.values())
    return out


def slo_fractions(p: Params) -> list[float]:
    """The SLO tightness sweep's points to predict: ``slo_sweep`` less the run's own slo_fraction where the
    duration sweep's factor-1 point already predicts it."""
    return [f for f in p.slo_sweep if not (math.isclose(f, p.slo_fraction) and 1.0 in p.regime_duration_scale)]


def slo_point(p: Params, profile: Profile, fraction: float, sets: dict | None = None) -> dict[str, dict[str, float]]:
    """One point of the SLO tightness sweep (modelled): the headline's profile (duration factor 1) with the
    SLO derived at ``slo_fraction = fraction`` (``slo_cold_starts`` as in the run), the static plans re-chosen
    on the calibration videos and every variant predicted, as at a regime point (``regime_point``)."""
    return regime_point(p.model_copy(update={"slo_fraction": float(fraction)}), profile, 1.0, sets)


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
    """The SLO and the deployable static plans (both from the separate calibration videos;
    ``calibration``: the predicted attainment there of Llama, which best_static must reach (no
    tolerance subtracted), and of each deployable plan; ``calibration_scored``: every static plan's
    predicted cost and attainment there), and for every repeat's evaluated videos the reference answers
    (``answers[r]``) and every deployable plan's (and Llama's) predicted outcome (``predicted``: the median
    over the repeats, ``predicted_repeats[r]``: per repeat). Every static plan's predicted outcome on repeat
    0's videos orders the hindsight search for static_oracle (see ``search_oracle``)."""
    args = p.op_args()
    cal_videos = workload(p, calibration=True)
    cal_trace, _ = reference(cal_videos, args, labels=False)   # no answer is checked on them
    cal_jobs = jobs_of(p, cal_videos, calibration=True)
    # the SLO comes from warm predictions (no keep-alive expiry) on the calibration videos, plus cold starts
    slo, worst = derive_slo(p, cal_jobs, profile, cal_trace)
    plans, calibration, cal_scored = deployable_plans(p, cal_jobs, profile, cal_trace, slo)
    answers, per_repeat, scored = {}, [], []
    for r in range(p.repeats):
        videos = workload(p, repeat=r)
        trace, answers[r] = reference(videos, args)
        jobs = jobs_of(p, videos, repeat=r)
        if r == 0:   # hindsight scoring of every plan for the oracle's search order (target unused)
            _, scored = choose_statics(jobs, profile, trace, args, slo, p.keep_alive_s, p.max_instances, 1.0,
                                       p.prewarm)
        per_repeat.append({name: predict_run(jobs, policy_of(p, name, plans, profile), profile, trace, args, slo,
                                             p.keep_alive_s, p.max_instances, p.prewarm).summary(slo)
                           for name in (*plans, "llama", "llama_once")})
    predicted = {name: {m: float(statistics.median(r[name][m] for r in per_repeat)) for m in per_repeat[0][name]}
                 for name in per_repeat[0]}
    return {"slo_s": slo, "worst_predicted_s": worst, "plans": plans, "labels": {n: plan_label(pl) for n, pl in plans.items()},
            "calibration": calibration, "answers": answers, "predicted": predicted, "predicted_repeats": per_repeat,
            "calibration_scored": [{"label": plan_label(c["plan"]), "cost": c["cost"],
                                    "slo_attainment": c["slo_attainment"]} for c in cal_scored],
            "candidates": len(scored), "oracle_order": oracle_order(scored),
            "frontier": sorted((c["slo_attainment"], c["cost"]) for c in scored)}


def oracle_order(scored: list[dict]) -> list[dict]:
    """Every static plan, cheapest predicted cost on the evaluated videos first (ties: the higher
    predicted attainment first): the order of the hindsight search."""
    return [{**c, "label": plan_label(c["plan"])}
            for c in sorted(scored, key=lambda c: (c["cost"], -c["slo_attainment"], plan_label(c["plan"])))]


def search_oracle(order: list[dict], run, target: float, tries: int) -> dict:
    """static_oracle, in hindsight on the evaluated videos: the cheapest static plan whose run on them
    reaches ``target`` (Llama's measured attainment there). Plans are run (``run(configs)`` -> a
    variant's output with ``metrics``) in ``order``, at most ``tries`` of them; the first that reaches the
    target is the oracle. Should none, the tried plan with the highest attainment (then the cheapest)
    stands in, flagged ``reached=False``. Returns the chosen candidate, its run, every try and the flag."""
    if not order:
        raise ValueError("no static plan to search")
    tried, runs = [], []
    for cand in order[:max(1, tries)]:
        out = run(cand["plan"])
        m = out["metrics"]
        tried.append({"label": cand["label"], "slo_attainment": m["slo_attainment"], "cost": m["cost"],
                      "predicted_cost": cand["cost"], "predicted_slo_attainment": cand["slo_attainment"]})
        runs.append((cand, out))
        if m["slo_attainment"] >= target - 1e-9:
            return {"candidate": cand, "run": out, "tried": tried, "reached": True}
    i = max(range(len(tried)), key=lambda i: (tried[i]["slo_attainment"], -tried[i]["cost"]))
    return {"candidate": runs[i][0], "run": runs[i][1], "tried": tried, "reached": False}


def attainment_verdict(technique: float, baseline: float, videos: int, ratio: float | None = None,
                       tolerance: float = 0.0) -> dict:
    """Whether a cost comparison of the technique against a baseline is at equal attainment on the
    evaluated videos (attainment moves in steps of 1 / videos; ``videos_short`` / ``videos_over``: how many
    videos the technique met fewer / more; ``within``: the two differ by at most ``tolerance``, the run's
    ``attainment_tolerance``, and count as equal). The same test for every repeat's pair, the notes and
    the regime's points. Cost is compared only where the baseline reaches the technique's attainment
    within the tolerance: the ratio (``ratio``: baseline cost / technique cost, > 1: the technique is
    cheaper) ``stands`` where the two are within it, or where the baseline met more videos and is also
    cheaper (ahead on both: the technique loses at least by the ratio). Where the technique met more
    videos and is also cheaper (``technique_ahead``), it is ahead on both, yet the baseline did not reach
    its attainment: no cost result at equal attainment. Otherwise the cheaper side bought its cost with
    missed deadlines."""
    step = 1.0 / videos
    short = max(0, math.ceil((baseline - technique) / step - 1e-9))
    over = max(0, math.ceil((technique - baseline) / step - 1e-9))
    equal = short == 0 and over == 0
    within = abs(technique - baseline) <= tolerance + 1e-9
    baseline_ahead = not within and ratio is not None and ratio <= 1 and short > 0
    technique_ahead = not within and ratio is not None and ratio >= 1 and over > 0
    return {"equal": equal, "within": within, "stands": within or baseline_ahead, "step": step,
            "tolerance": tolerance, "technique": technique, "baseline": baseline, "videos_short": short,
            "videos_over": over, "baseline_ahead": baseline_ahead, "technique_ahead": technique_ahead}


def run_variant(p: Params, name: str, plan: dict, profile: Profile, configs: dict | None = None,
                repeat: int = 0) -> dict:
    """One variant over repeat ``repeat``'s videos on a fresh serverless pool of real worker processes;
    ``configs``: a static plan to run under ``name`` (the hindsight search) instead of the planned one."""
    videos = workload(p, repeat=repeat)
    jobs = jobs_of(p, videos, repeat=repeat)
    answers = plan["answers"][repeat]
    policy = StaticPolicy(name, configs, profile) if configs is not None else policy_of(p, name, plan["plans"], profile)
    with WorkerPool(p.keep_alive_s, p.max_instances) as pool:
        for tier in ("cpu", "gpu"):   # provisioned concurrency: the same warm start for every variant
            pool.prewarm(tier, p.prewarm, 0.0)
        res = execute(jobs, policy, pool, RealRunner(p.gpu_speedup()), p.op_args(), plan["slo_s"], p.prices())
        pids = list(pool.stats.pids)
    summary = res.summary(plan["slo_s"])
    summary["answers_match"] = float(all(tuple(v.counts) == tuple(answers[v.video]) for v in res.videos))
    return {"metrics": summary, "latencies": [v.latency_s for v in res.videos], "configs": dict(res.configs),
            "pids": pids, "rtt_s": res.rtt_s}
