"""Evaluate one accelerator design: roofline latencies, the per-layer scheduling ILP for every
(tensor-parallel degree, micro-batch size), then the placement DP. One call is one Dask task."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

from .arch import Arch, Tech, area_mm2
from .ops import Model, activation_bytes, layer_graphs
from .placement import LayerCost, System, place
from .schedule import ilp_schedule


@dataclass(frozen=True)
class Space:
    tps: tuple[int, ...]
    mbs: tuple[int, ...]
    chips: int
    global_batch: int
    state_bytes_per_param: float
    ilp_time_limit_s: float
    seed: int = 0
    # the regime: HBM GiB per stack at which the placement is redone on the same layer costs
    regime_gib_per_stack: tuple[float, ...] = ()


def layer_costs(arch: Arch, tech: Tech, mdl: Model, tp: int, mb: int, time_limit_s: float, seed: int,
                stats: dict) -> list[LayerCost]:
    """Costs of the layer sequence [embed, block x layers, head] at (tp, mb): one ILP per layer kind and
    pass. The recompute pass is the forward graph followed by the backward graph, joined at the forward's
    one sink, so its optimal makespan is the sum of the two (tests check this against the ILP on the
    joined graph). The block's serial times (one op at a time, in graph order) are summed into ``stats``
    so the report can say what the ILP's overlap saved in each pass."""
    per_kind = {}
    for kind, params in (("embed", mdl.embed_params()), ("block", mdl.block_params()), ("head", mdl.head_params())):
        graphs = layer_graphs(kind, arch, tech, mdl, tp, mb)
        fwd = ilp_schedule(graphs["fwd"], time_limit_s, seed)
        bwd = ilp_schedule(graphs["bwd"], time_limit_s, seed)
        for s in (fwd, bwd):
            stats["ilps"] += 1
            stats["ilp_max_gap"] = max(stats["ilp_max_gap"], s.gap)
            stats["ilp_solve_s"] += s.seconds
            stats["ilp_optimal"] += s.status.startswith("Optimal")
        if kind == "block":
            for pas, sched in (("fwd", fwd), ("bwd", bwd)):
                stats[f"block_{pas}_serial_s"] += sum(o.duration for o in graphs[pas])
                stats[f"block_{pas}_s"] += sched.makespan
        stash, inp = activation_bytes(kind, mdl, tp, mb)
        per_kind[kind] = LayerCost(fwd.makespan, bwd.makespan, fwd.makespan + bwd.makespan, stash, inp, params / tp)
    return [per_kind["embed"], *([per_kind["block"]] * mdl.layers), per_kind["head"]]


def single_chip_score(arch: Arch, tech: Tech, mdl: Model, space: Space) -> float:
    """The chip-first user's ranking alone: block training samples per second on one chip (t = 1, best
    micro-batch, no memory limit), from the same scheduling ILPs as ``evaluate_design``'s
    ``single_chip_samples_per_s`` without scheduling the other layers and degrees."""
    best = 0.0
    for b in space.mbs:
        graphs = layer_graphs("block", arch, tech, mdl, 1, b)
        step = sum(ilp_schedule(graphs[pas], space.ilp_time_limit_s, space.seed).makespan for pas in ("fwd", "bwd"))
        best = max(best, b / step)
    return best


def evaluate_design(arch: Arch, tech: Tech, mdl: Model, space: Space) -> dict:
    """Throughput of the best placement of ``mdl`` on ``space.chips`` copies of ``arch`` and the design's
    single-chip score (block training samples per second on one chip, best micro-batch, no memory limit)."""
    started = time.perf_counter()
    stats = dict(ilps=0, ilp_max_gap=0.0, ilp_solve_s=0.0, ilp_optimal=0, block_fwd_serial_s=0.0, block_fwd_s=0.0,
                 block_bwd_serial_s=0.0, block_bwd_s=0.0)
    tps = tuple(t for t in space.tps if mdl.heads % t == 0 and t <= space.chips)
    costs = {(t, b): layer_costs(arch, tech, mdl, t, b, space.ilp_time_limit_s, space.seed, stats)
             for t in tps for b in space.mbs}
    sysm = System(chips=space.chips, global_batch=space.global_batch, hbm_bytes=arch.hbm_gib(tech) * 2 ** 30,
                  link_gb_s=tech.link_gb_s, link_latency_us=tech.link_latency_us,
                  state_bytes_per_param=space.state_bytes_per_param,
                  boundary_bytes_per_sample=2.0 * mdl.seq * mdl.hidden)
    ilp_s = time.perf_counter() - started
    plan, tried = place(costs, sysm, tps, space.mbs)
    single = max(b / (costs[(1, b)][1].fwd_s + costs[(1, b)][1].bwd_s) for b in space.mbs) if 1 in tps else 0.0
    out = dict(arch=asdict(arch), area_mm2=area_mm2(arch, tech), single_chip_samples_per_s=single,
               configs_tried=tried, ilp_phase_s=ilp_s, dp_phase_s=time.perf_counter() - started - ilp_s,
               wall_s=time.perf_counter() - started, **stats)
    regime = {}
    for gib in space.regime_gib_per_stack:  # the ILPs' costs do not depend on the capacity: only the DP reruns
        at, _ = place(costs, replace(sysm, hbm_bytes=arch.hbm_stacks * gib * 2 ** 30), tps, space.mbs)
        regime[gib] = 0.0 if at is None else space.global_batch * mdl.seq / at.iteration_s
    out["regime_throughput"] = regime
    # the same placement search without a memory limit: where it is faster, HBM capacity binds on this design
    # (the DP had to recompute, pipeline deeper or shrink micro-batches to fit)
    free, _ = place(costs, replace(sysm, hbm_bytes=math.inf), tps, space.mbs)
    out["unbounded_throughput"] = 0.0 if free is None else space.global_batch * mdl.seq / free.iteration_s
    if free is not None:
        out["unbounded_plan"] = dict(tp=free.tp, pp=free.pp, dp=free.dp, micro_batch=free.micro_batch,
                                     peak_hbm_gib=max(free.stage_memory) / 2 ** 30)
    if plan is None:
        out.update(feasible=False, train_throughput=0.0)
        return out
    out.update(feasible=True, train_throughput=space.global_batch * mdl.seq / plan.iteration_s,
               iteration_s=plan.iteration_s, plan=dict(tp=plan.tp, pp=plan.pp, dp=plan.dp, micro_batch=plan.micro_batch,
                                                       bounds=list(plan.bounds), recompute=list(plan.recompute)),
               recompute_stages=sum(plan.recompute), peak_hbm_gib=max(plan.stage_memory) / 2 ** 30)
    return out
