"""Prefect tasks of the Llama flow: profile the serverless workers, plan (reference answer, SLO and
deployable static plans on calibration videos), then run one variant over the whole workload on its own
fresh worker pool (the hindsight search for static_oracle runs candidate static plans the same way).

Granularity: a task runs a whole step; the invocations inside it go to worker processes the task's
serverless runtime starts on demand (``systems/llama/runtime.py``), so each invocation costs a pipe
round trip, not a Prefect task dispatch."""
from __future__ import annotations

import json

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.llama import Params
from mlsys_flows.systems.llama import experiment as ex


@task(name="llama-profile")
def profile(p: Params) -> dict:
    """Latency per (op, tier, batch size) on warm workers of each tier, and measured cold starts."""
    log = get_run_logger()
    out = ex.run_profile(p)
    prof = out["profile"]
    log.info("llama profile: cold start cpu %.3f s, gpu %.3f s; classify cpu %s ms, gpu %s ms (batches %s)",
             prof.cold_start_s["cpu"], prof.cold_start_s["gpu"],
             [round(x * 1e3, 2) for x in prof.latency["classify/cpu"]],
             [round(x * 1e3, 2) for x in prof.latency["classify/gpu"]], list(prof.batches))
    return out


@task(name="llama-plan")
def plan(p: Params, prof: dict, storage: ObjectStorage, key: str) -> dict:
    """The reference answers per repeat, the SLO, the deployable static plans and their calibration attainments
    (saved at ``key``)."""
    log = get_run_logger()
    out = ex.make_plan(p, prof["profile"])
    storage.write_bytes(key, json.dumps({"slo_s": out["slo_s"], "plans": out["labels"], "predicted": out["predicted"],
                                         "calibration": out["calibration"],
                                         "answers": {str(r): {str(k): list(v) for k, v in a.items()}
                                                     for r, a in out["answers"].items()}},
                                        indent=1).encode())
    log.info("llama plan: SLO %.3f s; %d static plans scored; best static (reaching Llama's predicted %.3f of the "
             "calibration videos, less %.3f): %s", out["slo_s"], out["candidates"], out["calibration"]["llama"],
             p.attainment_tolerance, out["labels"]["best_static"])
    return out


@task(name="llama-run")
def run_variant(p: Params, name: str, plan_: dict, prof: dict, repeat: int, configs: dict | None = None) -> dict:
    """Every video of repeat ``repeat`` (its own videos and arrivals) under one variant's policy (``configs``:
    this static plan), invocations in real worker processes."""
    log = get_run_logger()
    out = ex.run_variant(p, name, plan_, prof["profile"], configs, repeat)
    m = out["metrics"]
    log.info("llama %s repeat %d: cost/video %.3g USD, mean latency %.3f s, SLO met %.0f%%, %d cold starts (%.2f s), "
             "%d invocations, answers match %s", name, repeat, m["cost"], m["mean_latency_s"], 100 * m["slo_attainment"],
             m["cold_starts"], m["cold_start_s"], m["invocations"], bool(m["answers_match"]))
    return out


@task(name="llama-regime")
def regime(p: Params, prof: dict) -> dict[str, dict[float, dict]]:
    """The operator duration / cold start sweep and the SLO tightness sweep (both modelled from the profile,
    no processes): ``{"duration": factor -> point, "slo": slo_fraction -> point}``."""
    log = get_run_logger()
    out = {}
    sets = ex.regime_sets(p)   # the videos and their traces, once for every factor
    slo = {}
    for f in ex.slo_fractions(p):
        slo[f] = ex.slo_point(p, prof["profile"], f, sets)
        log.info("llama SLO sweep slo_fraction %g: SLO %.4f s, attainment llama %.2f, all_cpu %.2f", f,
                 slo[f]["llama"]["slo_s"], slo[f]["llama"]["slo_attainment"], slo[f]["all_cpu"]["slo_attainment"])
    for k in p.regime_duration_scale:
        out[k] = ex.regime_point(p, prof["profile"], k, sets)
        log.info("llama regime x%g: cost best_static/llama %.3f, all_cpu/llama %.3f, attainment llama %.2f vs "
                 "best_static %.2f, all_cpu %.2f", k, out[k]["best_static"]["cost"] / out[k]["llama"]["cost"],
                 out[k]["all_cpu"]["cost"] / out[k]["llama"]["cost"], out[k]["llama"]["slo_attainment"],
                 out[k]["best_static"]["slo_attainment"], out[k]["all_cpu"]["slo_attainment"])
    if 1.0 in out:   # the run's own SLO tightness: the duration sweep's factor-1 point
        slo[p.slo_fraction] = out[1.0]
    return {"duration": out, "slo": dict(sorted(slo.items()))}
