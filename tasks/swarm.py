"""Prefect tasks of the swarm flow: one simulation (one swarm size, one policy, one repeat) per task."""
from __future__ import annotations

from prefect import get_run_logger, task

from mlsys_flows.systems.swarm import Params, simulate_repeat


@task(name="swarm-simulate")
def simulate_one(p: Params, n: int, policy: str, repeat: int) -> dict:
    """One event simulation (``simulate_repeat``) on a Dask worker, logged."""
    out = simulate_repeat(p, n, policy, repeat)
    m = out["metrics"]
    get_run_logger().info(
        "N=%d %s (repeat %d): p99 decision latency %.1f ms, mean completion %.2f s, %d/%d tasks completed, "
        "compute mean %.3f ms over %d calls, %.1f s of work", n, policy, repeat, m["p99_decision_latency_s"] * 1e3,
        m["mean_completion_s"], m["tasks_completed"], m["tasks_arrived"], m["compute_s_mean"] * 1e3, out["n_compute"],
        out["work_s"])
    return out
