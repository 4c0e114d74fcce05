"""FlexShard's experiment: the plans every variant replays, the held-out replay of a chunk, a regime
point and the summary of a replay (numpy; the package itself holds only Params and SPEC)."""
from __future__ import annotations

import hashlib
import io

import numpy as np

from . import ABLATION, HEADROOM_SWEEP, REGIME_VARIANTS, VARIANTS, Params
from .plan import FULL, NODE, SHARD, Plan, Topology, access_estimates, flexshard, rowwise, rowwise_cache
from .replay import fetch_stream, replay
from .workload import Workload, heldout_chunk


def sweep_points(p: Params) -> list[tuple[float, str, str]]:
    """The headroom sweep: (headroom, FlexShard plan, row-wise + cache plan at equal memory); the
    run's own headroom uses the headline plans."""
    return [(h, "flexshard", "rowwise_cache") if h == p.memory_headroom else (h, f"sweep_{h:g}", f"sweep_cache_{h:g}")
            for h in sorted(set(HEADROOM_SWEEP) | {p.memory_headroom})]


def equal_memory_pair(demand: np.ndarray, u: np.ndarray, counts: np.ndarray, offsets: np.ndarray, topo: Topology,
                      headroom: float, names: tuple[str, str]) -> dict[str, Plan]:
    """FlexShard under ``headroom``, and row-wise sharding with a hot-row cache in the per-device
    memory FlexShard's plan holds (the busiest device's row copies)."""
    fs = flexshard(demand, u, offsets, topo, headroom)
    fs.name = names[0]
    cache = rowwise_cache(offsets, topo, counts, int(fs.rows_per_device(topo).max()), names[1])
    return {names[0]: fs, names[1]: cache}


def make_plans(p: Params, w: Workload) -> dict[str, Plan]:
    """Every plan a variant or the sweep replays: the row-wise baseline; FlexShard planned for
    per-lookup fetches (demand: expected lookups) and for deduplicated ones (demand: the probability
    of touching the row), each with its equal-memory row-wise cache; and the sweep's pairs."""
    topo = p.topology()
    lam, q, u = access_estimates(w.train_counts, w.offsets, w.train_iterations, w.devices)
    plans = {"rowwise": rowwise(w.offsets, topo)}
    plans |= equal_memory_pair(lam, u, w.train_counts, w.offsets, topo, p.memory_headroom,
                               ("flexshard", "rowwise_cache"))
    plans |= equal_memory_pair(q, u, w.train_counts, w.offsets, topo, p.memory_headroom,
                               ("flexshard_dedup", "rowwise_dedup_cache"))
    plans[ABLATION] = flexshard(lam, u, w.offsets, topo, p.memory_headroom, tiered=False)
    plans[ABLATION].name = ABLATION
    for h, fs, cache in sweep_points(p):
        if fs not in plans:
            plans |= equal_memory_pair(lam, u, w.train_counts, w.offsets, topo, h, (fs, cache))
    return plans


def replays(p: Params) -> dict[str, tuple[str, bool]]:
    """What the replay runs on every held-out chunk: name -> (plan, dedup): the variants, then the
    sweep's plans (per-lookup fetches, the headline's setting)."""
    out = dict(VARIANTS)
    for _, fs, cache in sweep_points(p):
        out.setdefault(fs, (fs, False))
        out.setdefault(cache, (cache, False))
    return out


def plans_to_npz(plans: dict[str, Plan]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"{k}.tier": v.tier for k, v in plans.items()},
                        **{f"{k}.owner": v.owner.astype(np.int16) for k, v in plans.items()},  # < 1024 devices
                        **{f"{k}.capacity": np.array(v.capacity_rows) for k, v in plans.items()})
    return buf.getvalue()


def plans_from_npz(data: bytes) -> dict[str, Plan]:
    z = np.load(io.BytesIO(data))
    names = sorted({k.rsplit(".", 1)[0] for k in z.files})
    return {k: Plan(k, z[f"{k}.tier"], z[f"{k}.owner"].astype(np.int32), int(z[f"{k}.capacity"])) for k in names}


def plan_metrics(plan: Plan, p: Params, baseline_rows: int) -> dict[str, float]:
    """Memory of a plan: rows and bytes per device (the busiest device) against the row-wise
    footprint, and its tiers (a cache's rows are its FULL rows)."""
    per_device = plan.rows_per_device(p.topology())
    tiers = np.bincount(plan.tier, minlength=3)
    return {"memory_rows_per_device": float(per_device.max()),
            "memory_bytes_per_device": float(per_device.max() * p.dim * p.element_bytes),
            "memory_vs_rowwise": float(per_device.max() / baseline_rows),
            "rows_full_replica": float(tiers[FULL]), "rows_node_replica": float(tiers[NODE]),
            "rows_sharded": float(tiers[SHARD])}


def replay_chunk(p: Params, w: Workload, plans: dict[str, Plan], ids: np.ndarray, counts: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """Every variant and sweep plan on one held-out chunk: name -> field -> per-iteration values. A plan
    equal to one already replayed in the same setting (sweep points past FlexShard's saturation, the
    empty cache at zero headroom) reuses that replay."""
    topo = p.topology()
    streams = {dedup: fetch_stream(ids, counts, w.total_rows, dedup) for dedup in (False, True)}
    out, done = {}, {}
    for name, (plan, dedup) in replays(p).items():
        pl = plans[plan]
        key = (hashlib.sha256(pl.tier.tobytes() + pl.owner.tobytes()).hexdigest(), dedup)
        if key not in done:
            done[key] = {k: v.tolist() for k, v in
                         replay(pl, ids, counts, topo, w.total_rows, dedup, streams[dedup]).items()}
        out[name] = done[key]
    return out


def regime_point(p: Params, lookups_per_row: float) -> dict[str, dict[str, float]]:
    """One point of the regime sweep: one table of ``p.regime_rows(lookups_per_row)`` rows (batch, sequence,
    devices and headroom as ``p``), planned from ``regime_train_iterations`` and replayed on
    ``regime_eval_iterations`` held-out ones: {variant: summarized metrics} for ``REGIME_VARIANTS``."""
    q = type(p).model_validate({**p.model_dump(), "tables": 1, "rows": p.regime_rows(lookups_per_row),
                                "train_iterations": p.regime_train_iterations,
                                "eval_iterations": p.regime_eval_iterations, "replay_tasks": 1})
    w, topo = q.make_workload(), q.topology()
    lam, qq, u = access_estimates(w.train_counts, w.offsets, w.train_iterations, w.devices)
    plans = {"rowwise": rowwise(w.offsets, topo)}
    plans |= equal_memory_pair(lam, u, w.train_counts, w.offsets, topo, q.memory_headroom, ("flexshard", "rowwise_cache"))
    # the dedup setting, planned for it (demand: the probability a device touches the row), at its own equal memory
    plans |= equal_memory_pair(qq, u, w.train_counts, w.offsets, topo, q.memory_headroom,
                               ("flexshard_dedup", "rowwise_dedup_cache"))
    plans[ABLATION] = flexshard(lam, u, w.offsets, topo, q.memory_headroom, tiered=False)
    ids, counts = heldout_chunk(w, q.eval_iterations, 0, q.seed)
    streams = {dedup: fetch_stream(ids, counts, w.total_rows, dedup) for dedup in (False, True)}
    out = {}
    for name in REGIME_VARIANTS:
        plan, dedup = VARIANTS[name]
        out[name] = summarize({k: v.tolist() for k, v in replay(plans[plan], ids, counts, topo, w.total_rows, dedup,
                                                                 streams[dedup]).items()})
        out[name]["memory_vs_rowwise"] = float(plans[plan].rows_per_device(topo).max() / plans["rowwise"].capacity_rows)
    return out


def summarize(per_iteration: dict[str, list[float]]) -> dict[str, float]:
    """Mean per iteration of the replayed fields, with the totals the ratios compare."""
    m = {k: float(np.mean(v)) for k, v in per_iteration.items()}
    m["alltoall_bytes"] = m["alltoall_intra_bytes"] + m["alltoall_inter_bytes"]
    m["sync_bytes"] = m["sync_intra_bytes"] + m["sync_inter_bytes"]
    m["comm_bytes"] = m["alltoall_bytes"] + m["sync_bytes"]
    m["comm_inter_node_bytes"] = m["alltoall_inter_bytes"] + m["sync_inter_bytes"]
    m["fetched_per_lookup"] = m["fetched_rows"] / m["lookups"]
    return m
