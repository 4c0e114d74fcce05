"""Prefect tasks of the AI Metropolis flow: plan on the simulated clock, then run one schedule for real.

Granularity (measured in every run, see ``noop``): a Prefect task costs tens to hundreds of
milliseconds to dispatch on the DaskTaskRunner, as much as or more than an LLM call here, so one
task runs one whole simulation (a policy, a repeat) on a Dask worker and the cluster steps inside it
go to a worker-side thread executor (microseconds per dispatch) whose calls really sleep.
"""
from __future__ import annotations

import json
import statistics
import time

from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.metropolis import (POLICIES, Params, execute, execute_model, simulate, sweep_radius,
                                           utilization)


def _truth_to_json(truth: dict) -> bytes:
    steps = sorted({(t, members) for (t, _), members in truth.items()})
    return json.dumps([[t, list(m)] for t, m in steps]).encode()


def _truth_from_json(blob: bytes) -> dict:
    return {(t, i): tuple(m) for t, m in json.loads(blob) for i in m}


@task(name="metropolis-plan")
def plan(p: Params, storage: ObjectStorage, truth_key: str, repeat: int) -> dict:
    """Every policy on the simulated clock (exact, no overhead) in repeat ``repeat``'s town, the true
    clusters of its global run saved at ``truth_key`` for the oracle, and the slot sweep."""
    log = get_run_logger()
    cfg = p.config(repeat=repeat)
    t0 = time.perf_counter()
    glob = simulate("global_sync", cfg, p.llm_slots)
    truth = glob.truth()
    storage.write_bytes(truth_key, _truth_to_json(truth))
    outs = {"global_sync": glob, "out_of_order": simulate("out_of_order", cfg, p.llm_slots),
            "oracle": simulate("oracle", cfg, p.llm_slots, truth=truth)}
    result = {"digest": glob.digest, "policies": {}}
    for name, o in outs.items():
        s = o.summary()
        s["steps_match_global"] = float(sorted(o.steps) == sorted(glob.steps))
        s["digest"] = o.digest
        s["utilization"] = utilization(o.busy_call_s, p.llm_slots, o.makespan_s)
        s["progress"] = o.progress
        result["policies"][name] = s
    result["sweep"] = {name: [] for name in POLICIES}
    for k in p.sweep_slots():
        for name in POLICIES:
            result["sweep"][name].append((k, simulate(name, cfg, k, truth=truth).makespan_s))
    log.info("metropolis plan, repeat %d (%.1f s): simulated makespan %s; %d cluster steps, %d LLM calls", repeat,
             time.perf_counter() - t0, {n: round(s["makespan_s"], 3) for n, s in result["policies"].items()},
             result["policies"]["global_sync"]["cluster_steps"], result["policies"]["global_sync"]["llm_calls"])
    return result


@task(name="metropolis-run")
def run_schedule(p: Params, policy: str, storage: ObjectStorage, truth_key: str, repeat: int) -> dict:
    """One simulation of repeat ``repeat``'s town under ``policy`` with real threads: every LLM call generates its tokens on the real
    model's batching server (llm=smollm2) or sleeps its latency holding one of the K slots (llm=sleep);
    the makespan is the wall clock of the whole simulation."""
    log = get_run_logger()
    truth = _truth_from_json(storage.read_bytes(truth_key)) if policy == "oracle" else None
    served = {}
    if p.llm == "smollm2":
        out, served = execute_model(policy, p.config(repeat=repeat), p.llm_slots, p.serve_config(), truth=truth)
    else:
        out = execute(policy, p.config(repeat=repeat), p.llm_slots, truth=truth)
    s = out.summary() | {f"served_{k}": float(v) for k, v in served.items()}
    s["digest"] = out.digest
    s["utilization"] = utilization(out.busy_call_s, p.llm_slots, out.makespan_s)
    log.info("metropolis %s repeat %d: makespan %.3f s, %d cluster steps, largest clock spread %d", policy, repeat,
             out.makespan_s, s["cluster_steps"], s["max_clock_spread"])
    return s


@task(name="metropolis-regime")
def regime(p: Params, towns: int) -> dict[int, dict[str, list[float]]]:
    """Every policy's simulated makespan at each interaction radius of the regime sweep, in each
    repeat's town."""
    log = get_run_logger()
    out = sweep_radius(p, towns)
    for r, m in out.items():
        log.info("radius %d: simulated makespan global_sync/out_of_order %.2f, oracle/out_of_order %.2f (median of "
                 "%d towns)", r, statistics.median(g / o for g, o in zip(m["global_sync"], m["out_of_order"])),
                 statistics.median(x / o for x, o in zip(m["oracle"], m["out_of_order"])), towns)
    return out


@task(name="metropolis-noop")
def noop(probe: int) -> float:
    """Nothing: timed from the flow, it gives the cost of dispatching one Prefect task. ``probe`` makes
    each call's inputs differ: Prefect's default cache would answer a repeat of the same inputs in one
    flow run from the first call's result, without dispatching it."""
    return time.perf_counter()
