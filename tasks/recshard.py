"""Prefect tasks of the RecShard flow: workload + profile, plans (greedy and MILP), held-out replay by
table shard, and the per-access cost of each memory tier."""
from __future__ import annotations

import io
from dataclasses import asdict

import numpy as np
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.recshard import (Params, Plan, Profile, build_table, make_plans, plan_costs, profile_table,
                                          replay, tables_from_npz, tables_to_npz)
from mlsys_flows.systems.recshard import tiers


@task(name="recshard-workload")
def make_workload(p: Params, storage: ObjectStorage, tables_key: str, profile_key: str) -> dict:
    """Generate the tables, profile the training trace; both saved on storage. Returns the keys."""
    log = get_run_logger()
    spec, samples = p.specs(), p.batch * p.train_batches
    tables, counts = [], []
    for j in range(p.num_tables):
        tables.append(build_table(spec, j, p.seed, p.hot_fraction, p.hot_share))
        counts.append(profile_table(tables[-1], j, samples, p.seed))
    prof = Profile(dim=spec.dim, samples=samples, counts=counts)
    storage.write_bytes(tables_key, tables_to_npz(tables))
    storage.write_bytes(profile_key, prof.to_npz())
    size = float((prof.rows * prof.row_bytes).sum())
    log.info("%d tables, %.3g rows (%.3g GB), training trace %d samples: %.3g lookups/sample, %.1f%% of rows touched",
             p.num_tables, prof.rows.sum(), size / 1e9, samples, prof.lookups_per_sample.sum(),
             100 * prof.touched.sum() / prof.rows.sum())
    return {"tables": tables_key, "profile": profile_key, "bytes": size}


@task(name="recshard-plan")
def plan(p: Params, storage: ObjectStorage, data: dict, plans_key: str) -> dict:
    """Greedy plans and RecShard's MILP plan from the training profile, checked against HBM capacity."""
    log = get_run_logger()
    prof = Profile.from_npz(storage.read_bytes(data["profile"]))
    plans, best, stats = make_plans(p, prof)
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"{n}_{f}": getattr(v, f) for n, v in plans.items() for f in ("gpu", "hot_rows")})
    storage.write_bytes(plans_key, buf.getvalue())
    model = p.model_costs(prof.dim)
    train = {n: plan_costs(v, prof, model, p.batch, p.gpus).max() for n, v in plans.items()}
    log.info("greedy: %s-balanced is best on the training trace; MILP %s in %.2f s, gap %.2g; profiled max "
             "per-GPU cost greedy %.4g ms -> recshard %.4g ms", best, stats.status, stats.solve_s, stats.gap,
             train["greedy"] * 1e3, train["recshard"] * 1e3)
    return {"plans": {n: (v.gpu, v.hot_rows) for n, v in plans.items()}, "best_greedy": best,
            "milp": asdict(stats), "train_max_cost_s": train}


@task(name="recshard-replay")
def replay_shard(p: Params, storage: ObjectStorage, data: dict, planned: dict, shard: int) -> dict[str, np.ndarray]:
    """Replay the held-out trace of tables shard, shard + replay_shards, ... against every plan."""
    log = get_run_logger()
    mine = list(range(shard, p.num_tables, p.replay_shards))
    tables = tables_from_npz(storage.read_bytes(data["tables"]), mine)
    prof = Profile.from_npz(storage.read_bytes(data["profile"]))
    plans = {n: Plan(np.asarray(g), np.asarray(h)) for n, (g, h) in planned["plans"].items()}
    counts = replay(tables, prof, plans, p.batch, p.eval_batches, p.seed)
    log.info("shard %d: replayed %d tables x %d held-out batches", shard, len(mine), p.eval_batches)
    return counts


@task(name="recshard-tier-costs")
def tier_costs(p: Params, gpus: ResourcePool) -> dict:
    """Seconds per row access of the fast (HBM) and slow (UVM) tier at each dim, measured here."""
    device = gpus.device()
    fast, slow, what = tiers.measure(p.dims(), device, gathers=p.measure_gathers, fast_kb=p.fast_tier_kb,
                                     slow_mb=p.slow_tier_mb, repeats=p.measure_repeats, seed=p.seed)
    get_run_logger().info("tier costs %s", tiers.describe(fast, slow))
    return {"fast": fast, "slow": slow, "what": what, "device": device}
