"""Prefect tasks of the swarm flow: one simulation (one swarm size, one policy, one repeat) per task."""
from __future__ import annotations

import time

from prefect import get_run_logger, task

from mlsys_flows.systems.swarm import Params, simulate


@task(name="swarm-simulate")
def simulate_one(p: Params, n: int, policy: str, repeat: int) -> dict:
    """Runs the event simulation of ``policy`` with ``n`` drones on repeat ``repeat``'s workload; the
    backend's assignment solves and the drones' local picks really run here and their measured CPU
    time drives the event clock. Returns the metrics."""
    log = get_run_logger()
    t0 = time.perf_counter()
    res = simulate(p.config(n, repeat), policy)
    m = res.metrics()
    log.info("N=%d %s (repeat %d): p99 decision latency %.1f ms, mean completion %.2f s, %d/%d tasks completed, "
             "compute mean %.3f ms over %d calls, %.1f s of work", n, policy, repeat, m["p99_decision_latency_s"] * 1e3,
             m["mean_completion_s"], m["tasks_completed"], m["tasks_arrived"], m["compute_s_mean"] * 1e3,
             len(res.solve_s), time.perf_counter() - t0)
    return {"metrics": m, "n_compute": len(res.solve_s), "work_s": time.perf_counter() - t0}
