"""ReCycle flow: calibrate a transformer stage with torch, simulate ReCycle, Oobleck-style and Bamboo-style
training of D pipelines x S stages at 0, 1, 2 and 4 failures, and check the simulator against the real
decoupled schedule of one stage pair on two gloo processes."""
from __future__ import annotations

import statistics
import time

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.common.distributed import gloo_available
from mlsys_flows.systems.recycle.failover import PIPELINES, STAGES, FailoverConfig, draw_failure, summarize
from mlsys_flows.systems.recycle.result import build_result, shown_schedules
from mlsys_flows.tasks import recycle as t
from mlsys_flows.platform.ranks import RanksFailed

# ReCycle's ranks compute on the CPU (one core per stage worker, as calibrated): gloo even where workers have GPUs
CPU_RANKS = "gloo"


@system_flow("recycle")
def recycle(ctx: RunContext):
    p = ctx.params
    shown = shown_schedules()
    if p.failover_run and gloo_available():  # a cluster started elsewhere must have its 4 workers: say so now
        ctx.rank_workers(PIPELINES * STAGES, "failover_run", grow=False)
    # calibrations are timed: one after another, nothing else running
    calib = [t.calibrate.submit(p, r).result() for r in range(ctx.repeats)]
    # Oobleck's restart, measured on the cluster's workers (also alone), else the stated constant
    restart = _measure_restart(ctx) if p.measure_restart and gloo_available() else None
    restart_s = statistics.median(restart["seconds"]) if restart else None
    # the simulations only read the calibrated numbers: side by side
    futures = [t.simulate_policies.submit(p, c, shown if r == ctx.repeats - 1 else (), restart_s)
               for r, c in enumerate(calib)]
    sims = [fu.result() for fu in futures]
    gantt_key = t.gantt.submit(sims[-1][1], ctx.storage, ctx.key("gantt.png")).result()
    pair = t.stage_pair.submit(p).result() if p.pair_check else None
    failover = _failover(ctx) if p.failover_run and gloo_available() else None
    return build_result(p, ctx.repeats, calib, restart, sims, gantt_key, pair, failover)


def _measure_restart(ctx: RunContext) -> dict:
    """Oobleck's restart on the run's cluster: 2 stage workers checkpoint their stages (sharded), then,
    ``ctx.repeats`` times, a fresh launch of 2 ranks restores them, copies layers and takes one step
    (``systems.recycle.restart``); the launches' wall seconds and the slowest rank's phases."""
    p = ctx.params
    store = CheckpointStore(storage=ctx.storage, prefix=ctx.key("restart"), keep_last=1)
    try:
        shard_bytes = ctx.ranks(t.checkpoint_stage_rank, 2, store, "stages", p, backend=CPU_RANKS).results[0]
        launches = [ctx.ranks(t.restart_stage_rank, 2, store, "stages", p, backend=CPU_RANKS)
                    for _ in range(ctx.repeats)]
    finally:
        ctx.storage.delete(ctx.key("restart"))
    seconds = [run.seconds for run in launches]
    middle = launches[sorted(range(len(seconds)), key=seconds.__getitem__)[len(seconds) // 2]]
    phases = {k: max(r[k] for r in middle.results) for k in ("restore_s", "copy_s", "first_step_s")}
    return {"seconds": seconds, "phases": phases, "shard_bytes": shard_bytes, "world_size": 2}


def _failover(ctx: RunContext) -> dict:
    """ReCycle for real (``systems.recycle.failover``): 4 ranks, the victims' workers (``failover_victims``,
    else one rank drawn from the seed) SIGKILLed after ``failover_fail_step`` steps (else drawn) and a
    sharded checkpoint, the survivors rerouting; then the restart baseline on the surviving workers,
    restored from that checkpoint. Run last and alone: everything in it is timed."""
    p = ctx.params
    victims, fail_step = draw_failure(p.seed, p.failover_steps, p.failover_victims, p.failover_fail_step)
    cfg = FailoverConfig(d_model=p.d_model, heads=p.heads, layers_per_stage=p.layers_per_stage,
                         micro_batch=p.micro_batch, seq=p.seq, microbatches=p.failover_microbatches,
                         steps=p.failover_steps, calibration_reps=min(p.calibration_reps, 5), seed=p.seed,
                         victims=victims, fail_step=fail_step)
    # the workers holding the run's task results go to the ranks that survive (Dask would recompute
    # what a killed worker held during the launch); the victims take those holding least
    ordered = ctx.rank_workers(PIPELINES * STAGES, "failover_run")
    keep = iter(ordered[:len(ordered) - len(victims)])
    spare = iter(ordered[len(ordered) - len(victims):])
    workers = [next(spare) if r in victims else next(keep) for r in range(len(ordered))]
    for v in victims:
        ctx.keep_down(workers[v])
    store = CheckpointStore(storage=ctx.storage, prefix=ctx.key("failover"), keep_last=1)
    try:
        try:
            ctx.ranks(t.failover_recycle_rank, len(workers), store, "stages", cfg, workers=workers, backend=CPU_RANKS)
            raise RuntimeError(f"the failover run's victims {list(victims)} did not fail")
        except RanksFailed as exc:
            if set(exc.lost) != set(victims) or exc.failed:
                raise
            lost = sorted(exc.lost)
            recycle = [exc.results[r] for r in sorted(exc.results)]
        # Oobleck's choice (from the measured times) is shrunk pipelines on every survivor or only the
        # intact pipelines: its workers are the first survivors, in rank order
        survivors = [w for r, w in enumerate(workers) if r not in victims][:recycle[0]["restart_workers"]]
        measured = {k: recycle[0][k] for k in ("times", "p2p_s", "allreduce_s")}
        launched = time.time()
        restart = ctx.ranks(t.failover_restart_rank, len(survivors), store, "stages", cfg, launched, measured,
                            workers=survivors, backend=CPU_RANKS).results
    finally:
        ctx.storage.delete(ctx.key("failover"))
    return summarize(recycle, restart, cfg, lost)
