"""Prefect tasks of the ReCycle flow: calibrate a transformer stage with torch, simulate every policy,
draw the schedules, and run the real decoupled schedule of one stage pair on two gloo processes; and
the two rank functions (checkpoint a stage, restart it) the flow runs as ranks to measure a restart."""
from __future__ import annotations

from dataclasses import asdict

from prefect import get_run_logger, task

from mlsys_flows.blocks import CheckpointStore, ObjectStorage
from mlsys_flows.systems.common.distributed import RankInfo
from mlsys_flows.systems.recycle import HEADLINE_FAILURES, Params
from mlsys_flows.systems.recycle.experiment import compare, layer_costs
from mlsys_flows.systems.recycle.restart import build as build_stage
from mlsys_flows.systems.recycle.restart import restart as restart_stage
from mlsys_flows.systems.recycle.gantt import render_gantt, window_of
from mlsys_flows.platform.ranks import rank_alive


@task(name="recycle-calibrate")
def calibrate(p: Params, repeat: int) -> dict:
    """Median times of forward, B_input, B_weight, fused backward and Adam step of one stage (1 thread)."""
    from mlsys_flows.systems.recycle.stage import calibrate as run

    st = asdict(run(p.d_model, p.heads, p.layers_per_stage, p.micro_batch, p.seq, reps=p.calibration_reps,
                    seed=p.seed + repeat))
    get_run_logger().info("calibration %d: F %.2f ms, B_input %.2f ms, B_weight %.2f ms, fused B %.2f ms, "
                          "optimizer %.2f ms", repeat, st["forward"] * 1e3, st["backward_input"] * 1e3,
                          st["backward_weight"] * 1e3, st["backward_fused"] * 1e3, st["optimizer"] * 1e3)
    return st


def checkpoint_stage_rank(info: RankInfo, store: CheckpointStore, run_key: str, p: Params) -> int:
    """One stage worker before the failure: its stage and optimizer state as its shard of a sharded
    checkpoint (what a restart restores); the shard's bytes."""
    stage, opt = build_stage(p, p.seed + info.rank)
    record = store.write_shard(run_key, 0, info.rank, info.world_size,
                               {"model": stage.state_dict(), "opt": opt.state_dict()}, attempt=info.launch_id)
    return int(record["size"])


def restart_stage_rank(info: RankInfo, store: CheckpointStore, run_key: str, p: Params) -> dict:
    """One stage worker of a re-instantiated pipeline (``systems.recycle.restart``): restore from the
    committed checkpoint, copy rank 0's layers, one forward and backward."""
    return restart_stage(info.rank, p, lambda: store.restore_shard(run_key, info.rank, info.world_size)[1])


def failover_recycle_rank(info: RankInfo, store: CheckpointStore, run_key: str, cfg) -> dict:
    """One rank of the 4-rank ReCycle run (``systems.recycle.failover.recycle_rank``): its shard goes to
    ``store``; failure detection asks the cluster whether a peer's worker is still there."""
    from mlsys_flows.systems.recycle.failover import recycle_rank

    def save(step: int, state: dict) -> None:
        store.write_shard(run_key, step, info.rank, info.world_size, state, attempt=info.launch_id)
    return recycle_rank(info.rank, info.world_size, info.store, cfg, rank_alive(info), save)


def failover_restart_rank(info: RankInfo, store: CheckpointStore, run_key: str, cfg, launched_at: float,
                          measured: dict) -> dict:
    """One rank of the restart baseline (``systems.recycle.failover.restart_rank``): the survivors'
    reconfigured pipelines, restored from the 4-rank run's committed checkpoint."""
    from mlsys_flows.systems.recycle.failover import PIPELINES, STAGES, restart_rank

    def load(old_rank: int) -> dict:
        return store.restore_shard(run_key, old_rank, PIPELINES * STAGES)[1]
    return restart_rank(info.rank, info.world_size, info.store, cfg, launched_at, measured, load)


@task(name="recycle-simulate")
def simulate_policies(p: Params, times: dict, keep: tuple[str, ...] = (),
                      restart_s: float | None = None) -> tuple[dict, dict, dict]:
    """Every policy at every failure count on the cost model of one calibration; Oobleck's restart
    per failure is ``restart_s`` (measured) or the ``restart_iterations`` constant."""
    metrics, schedules, info = compare(p, layer_costs(times, p), p.failure_counts(), HEADLINE_FAILURES, keep,
                                       restart_s=restart_s)
    f = HEADLINE_FAILURES
    get_run_logger().info("simulated samples/s at %d failure(s): recycle %.1f, oobleck %.1f, bamboo %.1f (%s)", f,
                          metrics[f"recycle_f{f}"]["throughput"], metrics[f"oobleck_f{f}"]["throughput"],
                          metrics[f"bamboo_f{f}"]["throughput"], info[f"f{f}"])
    return metrics, schedules, info


@task(name="recycle-gantt")
def gantt(schedules: dict, storage: ObjectStorage, key: str) -> str:
    """The schedules of one steady iteration as a Gantt chart PNG on storage."""
    storage.write_bytes(key, render_gantt(schedules, {n: window_of(s) for n, s in schedules.items()}))
    return key


@task(name="recycle-stage-pair")
def stage_pair(p: Params) -> dict:
    """The real decoupled 1F1B schedule of two stages on two processes (gloo, 127.0.0.1)."""
    from mlsys_flows.systems.recycle.pairrun import PairConfig, run_pair

    cfg = PairConfig(d_model=p.d_model, heads=p.heads, layers=p.layers_per_stage, micro_batch=p.micro_batch,
                     seq=p.seq, microbatches=p.pair_microbatches, steps=p.repeats, warmup_steps=1,
                     calibration_reps=min(p.calibration_reps, 5), seed=p.seed)
    r = run_pair(cfg, timeout_s=480.0)
    get_run_logger().info("stage pair: predicted %.1f ms, measured %.1f ms per step", r["predicted_step_s"] * 1e3,
                          r["measured_step_s"] * 1e3)
    return r
