"""Prefect tasks of the RecShard flow: workload + profile, plans (greedy and MILP), held-out replay by
table shard, the per-access cost of each memory tier, and the sharded lookup run end to end."""
from __future__ import annotations

import io
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage, ResourcePool
from mlsys_flows.systems.recshard import (Params, Plan, Profile, build_table, lookup_traces, make_plans, plan_costs,
                                          profile_table, replay, tables_from_npz, tables_to_npz)
from mlsys_flows.systems.recshard import lookup as lk
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
    log.info("warm start: %s (best greedy on the training trace under the assumed bandwidths); MILP %s in %.2f s, "
             "gap %.2g, %d rows filled after rounding%s; profiled max per-GPU cost %s %.4g ms -> recshard %.4g ms",
             best, stats.status, stats.solve_s, stats.gap, stats.filled_rows,
             ", FELL BACK to the warm start" if stats.fell_back else "", best, train[best] * 1e3, train["recshard"] * 1e3)
    return {"plans": {n: (v.gpu, v.hot_rows) for n, v in plans.items()}, "warm_start": best,
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
def tier_costs(p: Params, pool: ResourcePool) -> dict:
    """Seconds per row access of the fast (HBM) and slow (UVM) tier at each dim, measured here."""
    with pool.claim() as device:
        fast, slow, what = tiers.measure(p.dims(), device, gathers=p.measure_gathers, fast_kb=p.fast_tier_kb,
                                         slow_mb=p.slow_tier_mb, repeats=p.measure_repeats, seed=p.seed)
        get_run_logger().info("tier costs %s", tiers.describe(fast, slow))
        return {"fast": fast, "slow": slow, "what": what, "device": device}


@task(name="recshard-lookup")
def lookup(p: Params, storage: ObjectStorage, data: dict, planned: dict, pool: ResourcePool, scratch: str) -> dict:
    """Every plan's sharded lookups over the first ``lookup_batches`` held-out batches, run end to end
    with torch and timed (``repeats`` times, plans interleaved). ``scratch`` names this run's folder for
    the memmap slow tier (under ``lookup_dir``); a rerun of the task starts it afresh and it is removed
    at the end."""
    log = get_run_logger()
    with pool.claim() as device:
        slow_tier = p.slow_tier(device)
        tables = tables_from_npz(storage.read_bytes(data["tables"]))
        prof = Profile.from_npz(storage.read_bytes(data["profile"]))
        plans = {n: Plan(np.asarray(g), np.asarray(h)) for n, (g, h) in planned["plans"].items()}
        traces = lookup_traces(p, tables, prof)
        del tables
        workdir = Path(p.lookup_dir or tempfile.gettempdir()) / re.sub(r"[^A-Za-z0-9_.-]", "_", scratch)
        shutil.rmtree(workdir, ignore_errors=True)  # a retried or recomputed task starts afresh
        workdir.mkdir(parents=True)
        try:
            out = lk.measure_plans(plans, traces, p.gpus, seed=p.seed, device=device, slow_tier=slow_tier,
                                   workdir=workdir, repeats=p.repeats)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        for n, r in out.items():
            log.info("lookup %s: %.4g samples/s (median of %d), %.3g MB fast, %.3g MB slow, %d slow accesses", n,
                     np.median([lk.samples_per_s(t, p.batch)[0] for t in r["times"]]), p.repeats, r["fast_bytes"] / 1e6,
                     r["slow_bytes"] / 1e6, r["slow_accesses"])
        return {"plans": out, "what": lk.describe(device, slow_tier, str(workdir) if slow_tier == "memmap" else None),
                "device": device, "slow_tier": slow_tier}
