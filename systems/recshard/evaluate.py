"""Replay of the HELD-OUT trace against plans: exact HBM and UVM access counts per batch and table,
then per-GPU time, throughput, load balance and slow-memory accesses."""
from __future__ import annotations

import numpy as np

from mlsys_flows.systems.common.embeddings import Table

from .sharding import Costs, Plan
from .workload import HELD_OUT, Profile, trace


def replay(tables: dict[int, Table], prof: Profile, plans: dict[str, Plan], batch: int, batches: int,
           seed: int) -> dict[str, np.ndarray]:
    """For the tables given (any subset: shards add up), the held-out trace's accesses per plan:
    {plan: int64 [2, batches, T]} with HBM hits in [0] and UVM accesses in [1] (zero for other tables)."""
    out = {name: np.zeros((2, batches, prof.num_tables), np.int64) for name in plans}
    for j, table in tables.items():
        ids, lengths = trace(table, j, batch * batches, seed, HELD_OUT)
        per_batch = lengths.reshape(batches, batch).sum(1)
        starts = np.concatenate([[0], np.cumsum(per_batch)[:-1]])
        ranks = prof.rank(j)[ids]
        for name, plan in plans.items():
            hits = np.add.reduceat((ranks < plan.hot_rows[j]).astype(np.int64), starts)
            out[name][0, :, j], out[name][1, :, j] = hits, per_batch - hits
    return out


def gpu_times(plan: Plan, counts: np.ndarray, costs: Costs, gpus: int) -> np.ndarray:
    """Seconds each GPU spends on its lookups in each batch: float [batches, gpus]."""
    per_table = counts[0] * costs.hbm + counts[1] * costs.uvm  # [batches, T]
    return per_table @ np.eye(gpus)[plan.gpu]


def metrics(plan: Plan, counts: np.ndarray, prof: Profile, gpus: int, capacity: float, batch: int,
            costs: Costs, model: Costs) -> dict[str, float]:
    """``costs``: the per-access costs of this run (measured or assumed), giving embedding_throughput;
    ``model``: the documented hardware model the planner uses, giving the deterministic metrics."""
    batches = counts.shape[1]
    t_run, t_model = gpu_times(plan, counts, costs, gpus), gpu_times(plan, counts, model, gpus)
    per_gpu = t_model.sum(0)
    hbm, uvm = counts[0].sum() / batches, counts[1].sum() / batches
    return {
        "embedding_throughput": batch * batches / t_run.max(1).sum(),
        "modelled_throughput": batch * batches / t_model.max(1).sum(),
        "load_imbalance": float(per_gpu.max() / per_gpu.mean()),
        "uvm_accesses_per_batch": float(uvm),
        "hbm_accesses_per_batch": float(hbm),
        "uvm_access_share": float(uvm / (hbm + uvm)),
        "hbm_used_fraction": float(plan.hbm_bytes(prof, gpus).max() / capacity),
        "tables_in_uvm": float(np.count_nonzero(plan.hot_rows == 0)),
    }


def greedy_row(variants: dict[str, dict[str, float]], by_run: str, by_model: str,
               run_metrics: set[str] | frozenset[str]) -> dict[str, float]:
    """The "greedy" variant, the best greedy per cost model: metrics scored with the run's costs
    (``run_metrics``: the measured lookup and the measured per-access costs) from ``by_run``, the greedy
    plan best on the training profile under those costs; every other metric (the assumed bandwidths and
    the counts) from ``by_model``, the greedy plan best on the training profile under the assumed
    bandwidths."""
    names = list(dict.fromkeys([*variants[by_model], *variants[by_run]]))
    return {m: variants[by_run if m in run_metrics else by_model][m] for m in names}


def cost_ratio_sweep(plans: dict[str, Plan], counts: dict[str, np.ndarray], fast: np.ndarray, ratios: list[float],
                     gpus: int, batch: int) -> dict[float, dict[str, float]]:
    """The regime: every plan's throughput on the held-out access counts when a slow-tier access costs
    ``ratio`` times a fast one. ``fast`` [T]: seconds per fast access of each table (measured in this
    run). Per ratio: {plan: samples / (sum over batches of the slowest GPU's time)} (GPUs concurrent)."""
    out = {}
    for r in ratios:
        costs = Costs(np.asarray(fast, float), float(r) * np.asarray(fast, float))
        out[float(r)] = {n: float(batch * counts[n].shape[1] / gpu_times(p, counts[n], costs, gpus).max(1).sum())
                         for n, p in plans.items()}
    return out
