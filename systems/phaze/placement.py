"""Device placement of a layer sequence: data (d), pipeline (p) and tensor (t) parallelism over a fixed
number of chips, micro-batch size b in the outer loop, and per pipeline stage the choice of stashing
activations (1F1B keeps min(p - k, m) micro-batches in flight on stage k) or recomputing them from
the stage's layer inputs. The pipeline split is an exact dynamic program over contiguous stages.

Model of one training iteration (global batch B, m = B / (d b) micro-batches):
  stage k, layers [i, j): c_k = sum of forward + backward (+ forward again if recomputing) layer times
  per micro-batch + the stage's pipeline sends; iteration = max_k [(m + p - 1) c_k + AR_k], where AR_k
  is the data-parallel all-reduce of the stage's gradients (ring over d chips), started when the
  stage finishes. Memory of stage k: weights, gradients and optimizer state (state_bytes_per_param per
  parameter, sharded t ways) + stashed activations; it must fit the chip's HBM.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mlsys_flows.errors import MlsysError


class PlacementError(MlsysError, ValueError):
    pass


@dataclass(frozen=True)
class LayerCost:
    """One layer at one (t, b): seconds per micro-batch and bytes per chip."""
    fwd_s: float
    bwd_s: float
    bwd_recompute_s: float
    stash_bytes: float        # activations kept per micro-batch for the backward pass
    input_bytes: float        # the layer's input, all that is kept when recomputing
    params: float             # parameters per chip (already divided by t)


@dataclass(frozen=True)
class System:
    chips: int
    global_batch: int
    hbm_bytes: float
    link_gb_s: float
    link_latency_us: float
    state_bytes_per_param: float
    boundary_bytes_per_sample: float   # activation bytes crossing a stage boundary per sample (before / t)


@dataclass(frozen=True)
class Plan:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    bounds: tuple[int, ...]            # stage k holds layers [bounds[k], bounds[k+1])
    recompute: tuple[bool, ...]
    iteration_s: float
    stage_memory: tuple[float, ...] = ()
    stage_time_s: tuple[float, ...] = ()


def ring_allreduce_s(nbytes: float, group: int, link_gb_s: float, latency_us: float) -> float:
    if group <= 1:
        return 0.0
    return 2 * (group - 1) / group * nbytes / (link_gb_s * 1e9) + 2 * (group - 1) * latency_us * 1e-6


def parallel_configs(chips: int, global_batch: int, layers: int, tps, mbs):
    """(t, p, d, b) with t * p * d = chips, p <= layers, b * d dividing the global batch."""
    for t in tps:
        if chips % t:
            continue
        for p in range(1, min(layers, chips // t) + 1):
            if (chips // t) % p:
                continue
            d = chips // (t * p)
            for b in mbs:
                if global_batch % (d * b) == 0:
                    yield t, p, d, b


def stage_cost(costs: list[LayerCost], i: int, j: int, k: int, p: int, m: int, t: int, d: int, b: int,
               sysm: System, recompute: bool) -> tuple[float, float, float]:
    """(per-micro-batch time c_k, iteration term (m + p - 1) c_k + AR_k, memory bytes) of stage k with
    layers [i, j) -- the independent scorer the DP is checked against."""
    layer = costs[i:j]
    inflight = min(p - k, m)
    weights = sysm.state_bytes_per_param * sum(c.params for c in layer)
    if recompute:
        mem = weights + inflight * sum(c.input_bytes for c in layer) + max(c.stash_bytes for c in layer)
        c_time = sum(c.fwd_s + c.bwd_recompute_s for c in layer)
    else:
        mem = weights + inflight * sum(c.stash_bytes for c in layer)
        c_time = sum(c.fwd_s + c.bwd_s for c in layer)
    sends = (k < p - 1) + (k > 0)
    c_time += sends * sysm.boundary_bytes_per_sample * b / t / (sysm.link_gb_s * 1e9)
    grads = 2.0 * sum(c.params for c in layer)
    ar = ring_allreduce_s(grads, d, sysm.link_gb_s, sysm.link_latency_us)
    return c_time, (m + p - 1) * c_time + ar, mem


def score_plan(plan: Plan, costs: list[LayerCost], sysm: System) -> tuple[float, tuple[float, ...]]:
    """Iteration time and per-stage memory of a plan, checked: the stages cover the layers in order and
    every stage fits in HBM (PlacementError otherwise)."""
    t, p, d, b = plan.tp, plan.pp, plan.dp, plan.micro_batch
    if t * p * d != sysm.chips:
        raise PlacementError(f"t*p*d = {t * p * d} != {sysm.chips} chips")
    if sysm.global_batch % (d * b):
        raise PlacementError("d * micro_batch does not divide the global batch")
    if len(plan.bounds) != p + 1 or plan.bounds[0] != 0 or plan.bounds[-1] != len(costs) or \
            any(x >= y for x, y in zip(plan.bounds, plan.bounds[1:])):
        raise PlacementError(f"bounds {plan.bounds} are not {p} non-empty contiguous stages of {len(costs)} layers")
    m = sysm.global_batch // (d * b)
    worst, mems = 0.0, []
    for k in range(p):
        _, g, mem = stage_cost(costs, plan.bounds[k], plan.bounds[k + 1], k, p, m, t, d, b, sysm, plan.recompute[k])
        if mem > sysm.hbm_bytes:
            raise PlacementError(f"stage {k} needs {mem / 2**30:.2f} GiB > {sysm.hbm_bytes / 2**30:.2f} GiB of HBM")
        worst = max(worst, g)
        mems.append(mem)
    return worst, tuple(mems)


def _prefix(x: list[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(x)])


def dp_split(costs: list[LayerCost], t: int, p: int, d: int, b: int, sysm: System) -> Plan | None:
    """Best contiguous split into p stages (exact DP over (stage, last layer)); per stage stash if it fits,
    else recompute if that fits (recomputing is never faster). None when nothing fits."""
    n = len(costs)
    m = sysm.global_batch // (d * b)
    fb = _prefix([c.fwd_s + c.bwd_s for c in costs])
    fbr = _prefix([c.fwd_s + c.bwd_recompute_s for c in costs])
    stash = _prefix([c.stash_bytes for c in costs])
    inp = _prefix([c.input_bytes for c in costs])
    par = _prefix([c.params for c in costs])
    st = np.array([c.stash_bytes for c in costs])
    i_idx, j_idx = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    valid = j_idx > i_idx
    # running max of per-layer stash over [i, j)
    peak = np.zeros((n + 1, n + 1))
    for i in range(n):
        peak[i, i + 1:] = np.maximum.accumulate(st[i:])
    weights = sysm.state_bytes_per_param * (par[j_idx] - par[i_idx])
    # ring_allreduce_s of the stage's gradients (2 bytes per parameter), vectorized: linear in the bytes
    ar = (ring_allreduce_s(2.0, d, sysm.link_gb_s, 0.0) * (par[j_idx] - par[i_idx])
          + ring_allreduce_s(0.0, d, sysm.link_gb_s, sysm.link_latency_us))
    send = sysm.boundary_bytes_per_sample * b / t / (sysm.link_gb_s * 1e9)
    best = np.full(n + 1, np.inf); best[0] = 0.0
    choice = []
    for k in range(p):
        inflight = min(p - k, m)
        sends = (k < p - 1) + (k > 0)
        mem_s = weights + inflight * (stash[j_idx] - stash[i_idx])
        mem_r = weights + inflight * (inp[j_idx] - inp[i_idx]) + peak
        g_s = (m + p - 1) * (fb[j_idx] - fb[i_idx] + sends * send) + ar
        g_r = (m + p - 1) * (fbr[j_idx] - fbr[i_idx] + sends * send) + ar
        fit_s, fit_r = mem_s <= sysm.hbm_bytes, mem_r <= sysm.hbm_bytes
        g = np.where(valid & fit_s, g_s, np.where(valid & fit_r, g_r, np.inf))
        rec = ~fit_s
        cand = np.maximum(best[:, None], g)             # [i, j]
        arg = np.argmin(cand, axis=0)
        new = cand[arg, np.arange(n + 1)]
        choice.append((arg, rec[arg, np.arange(n + 1)]))
        best = new
    if not math.isfinite(best[n]):
        return None
    bounds, recs, j = [n], [], n
    for k in range(p - 1, -1, -1):
        arg, rec = choice[k]
        i = int(arg[j])
        recs.append(bool(rec[j]))
        bounds.append(i)
        j = i
    bounds.reverse(); recs.reverse()
    if bounds[0] != 0:
        return None
    return Plan(t, p, d, b, tuple(bounds), tuple(recs), float(best[n]))


def place(costs_by_tb: dict[tuple[int, int], list[LayerCost]], sysm: System, tps, mbs) -> tuple[Plan | None, int]:
    """Best plan over every (t, p, d, b) (micro-batch size in the outer loop); returns (plan, configs tried)."""
    n = len(next(iter(costs_by_tb.values())))
    best, tried = None, 0
    for b in mbs:
        for t, p, d, bb in parallel_configs(sysm.chips, sysm.global_batch, n, tps, [b]):
            if (t, bb) not in costs_by_tb:
                continue
            tried += 1
            plan = dp_split(costs_by_tb[(t, bb)], t, p, d, bb, sysm)
            if plan is not None and (best is None or plan.iteration_s < best.iteration_s):
                best = plan
    if best is not None:
        it, mems = score_plan(best, costs_by_tb[(best.tp, best.micro_batch)], sysm)
        best = Plan(best.tp, best.pp, best.dp, best.micro_batch, best.bounds, best.recompute, it, mems)
    return best, tried


def exhaustive(costs_by_tb: dict[tuple[int, int], list[LayerCost]], sysm: System, tps, mbs) -> Plan | None:
    """Every (t, p, d, b), every contiguous split and every stash/recompute choice, scored by score_plan
    (tiny models only)."""
    n = len(next(iter(costs_by_tb.values())))
    best = None
    for t, p, d, b in parallel_configs(sysm.chips, sysm.global_batch, n, tps, mbs):
        if (t, b) not in costs_by_tb:
            continue
        for cuts in itertools.combinations(range(1, n), p - 1):
            for rec in itertools.product((False, True), repeat=p):
                plan = Plan(t, p, d, b, (0, *cuts, n), rec, 0.0)
                try:
                    it, _ = score_plan(plan, costs_by_tb[(t, b)], sysm)
                except PlacementError:
                    continue
                if best is None or it < best.iteration_s:
                    best = Plan(t, p, d, b, plan.bounds, rec, it)
    return best
