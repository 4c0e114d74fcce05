"""Prefect tasks of the SwiftMoE flow: generate the token stream, measure compute, train a policy."""
from __future__ import annotations

import time
from dataclasses import asdict

import torch
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.swiftmoe import Params, variant_policy
from mlsys_flows.systems.swiftmoe.calibrate import calibration_job as prepare_calibration
from mlsys_flows.systems.swiftmoe.cost import Profile, sweep_flexmoe_ratio
from mlsys_flows.systems.swiftmoe.train import build_workload, measure_profile, train_policy
from mlsys_flows.systems.swiftmoe.workload import Workload


@task(name="swiftmoe-workload")
def make_workload(p: Params, storage: ObjectStorage, key: str) -> dict:
    """The drifting, skewed token stream and the held-out set, stored once for every policy."""
    t0 = time.perf_counter()
    wl = build_workload(p)
    storage.write_bytes(key, wl.to_bytes())
    get_run_logger().info("swiftmoe workload: %d iterations x %d sequences x %d tokens, eval Bayes loss %.3f (%.1f s)",
                          p.iterations, p.batch, p.seq_len, wl.bayes_loss, time.perf_counter() - t0)
    return {"key": key, "bayes_loss": wl.bayes_loss}


@task(name="swiftmoe-profile")
def profile(p: Params, pool: ResourcePool) -> dict:
    """Measure one expert call (by rows) and one worker's dense part on this worker's device.
    Runs alone: every policy's time model uses this one measurement."""
    torch.set_num_threads(1)  # a simulated worker is one core
    with pool.claim() as device:
        prof = measure_profile(p, device)
    get_run_logger().info("swiftmoe profile on %s: expert call %.3f ms + %.4f ms/row, dense %.2f ms per micro-batch",
                          prof.device, prof.call_s * 1e3, prof.row_s * 1e3, prof.dense_s * 1e3)
    return asdict(prof)


@task(name="swiftmoe-calibration-job")
def calibration_job(p: Params, repeats: int) -> dict:
    """Each compared policy's recorded work at 2 workers and the compute profile: what the flow's 2 ranks
    replay (``ctx.ranks(replay_rank, ...)``) and what ``summarize`` prices on the simulator."""
    prepared = prepare_calibration(p, repeats)
    get_run_logger().info("swiftmoe calibration job: %s, %d iterations each at 2 workers x %d slots, batch %d",
                          ", ".join(prepared["job"]["traces"]), prepared["iterations"], prepared["slots_per_worker"],
                          prepared["batch"])
    return prepared


@task(name="swiftmoe-train")
def train(name: str, p: Params, storage: ObjectStorage, data: dict, prof: dict, pool: ResourcePool,
          record: bool = False) -> dict:
    """Train the tiny MoE for real under one variant's policy; simulated time comes from the
    profile, so variants may train concurrently without distorting each other's numbers (and
    without holding one of the pool's device slots each)."""
    log = get_run_logger()
    torch.set_num_threads(1)
    wl = Workload.from_bytes(storage.read_bytes(data["key"]))
    policy, cf = variant_policy(name, p.capacity_factor)
    run = train_policy(name, p, wl, Profile(**prof), pool.device(), log=log.info, policy=policy, capacity_factor=cf,
                       record=record)
    log.info("swiftmoe %s: time to target %.2f s (reached: %s), %.1f%% tokens dropped, %.2f MB expert traffic/iter",
             name, run.metrics["time_to_target_s"], bool(run.metrics["reached_target"]),
             100 * run.metrics["tokens_dropped_frac"], run.metrics["expert_bytes_moved_per_iter"] / 1e6)
    return asdict(run)


_KEEP = ("time_to_target_s", "reached_target", "iterations_to_target", "tokens_dropped_frac", "mean_iter_time_s",
         "target_loss", "best_eval_loss")


@task(name="swiftmoe-train-point")
def train_point(name: str, p: Params, prof: dict, pool: ResourcePool, capacity_factor: float | None = None) -> dict:
    """One variant on another trace than the evaluated one (the calibration seed, or a regime point's
    drift and seed): the workload is generated here; returns the time-to-target metrics and the held-out
    curve (so a regime point can be read at a target every compared variant reached)."""
    log = get_run_logger()
    torch.set_num_threads(1)
    policy, cf = variant_policy(name, p.capacity_factor if capacity_factor is None else capacity_factor)
    run = train_policy(name, p, build_workload(p), Profile(**prof), pool.device(), policy=policy, capacity_factor=cf)
    log.info("swiftmoe %s (seed %d, drift period %g, cf %g): time to target %.3f s (reached: %s)", name, p.seed,
             p.drift_period, cf, run.metrics["time_to_target_s"], bool(run.metrics["reached_target"]))
    return {k: float(run.metrics[k]) for k in _KEEP} | {"eval_clock_s": run.eval_clock_s, "eval_loss": run.eval_loss}


@task(name="swiftmoe-sweep")
def sweep(p: Params, prof: dict, flex: dict, swift: dict, links_gbps: list[float],
          state_scales: list[float]) -> dict[float, list[float]]:
    """Re-price the recorded FlexMoE and SwiftMoE traces for other links and expert-state sizes."""
    t0 = time.perf_counter()
    out = sweep_flexmoe_ratio(flex, swift, Profile(**prof), p.d_model, p.workers, links_gbps, state_scales,
                              p.precision)
    get_run_logger().info("swiftmoe sweep: %d links x %d state sizes re-priced in %.1f s", len(links_gbps),
                          len(state_scales), time.perf_counter() - t0)
    return out
