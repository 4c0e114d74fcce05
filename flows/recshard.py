"""RecShard flow: MILP embedding sharding vs greedy size/lookup-balanced sharders, replayed on a
held-out trace."""
from __future__ import annotations

import numpy as np

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.report import Assumption, Curve, param_assumptions
from mlsys_flows.systems.recshard import Costs, Plan, Profile, gpu_times, metrics
from mlsys_flows.systems.recshard import tiers
from mlsys_flows.tasks import recshard as t

# exact counts from replaying the plans on the held-out trace
COUNTED = ("uvm_accesses_per_batch", "hbm_accesses_per_batch", "uvm_access_share", "hbm_used_fraction",
           "tables_in_uvm", "milp_gap", "milp_optimal")
# the planner's cost model (assumed HBM/UVM bandwidths) applied to those counts or the training profile
BANDWIDTH_MODELLED = ("modelled_throughput", "load_imbalance", "train_max_cost_ms")
KINDS = {**dict.fromkeys(COUNTED, "counted"), **dict.fromkeys(BANDWIDTH_MODELLED, "modelled"),
         "embedding_throughput": "modelled", "milp_solve_s": "measured"}


@system_flow("recshard")
def recshard(ctx: RunContext) -> SystemResult:
    p = ctx.params
    data = t.make_workload.submit(p, ctx.storage, ctx.key("tables.npz"), ctx.key("profile.npz"))
    planned = t.plan.submit(p, ctx.storage, data, ctx.key("plans.npz"))
    shards = [t.replay_shard.submit(p, ctx.storage, data, planned, s) for s in range(p.replay_shards)]
    counts = {}
    for f in shards:
        for name, c in f.result().items():
            counts[name] = counts.get(name, 0) + c
    # timed alone, after the replay: nothing else runs on the workers meanwhile
    tier = t.tier_costs.submit(p, ctx.gpus).result()
    planned, data = planned.result(), data.result()

    prof = Profile.from_npz(ctx.storage.read_bytes(data["profile"]))
    plans = {n: Plan(np.asarray(g), np.asarray(h)) for n, (g, h) in planned["plans"].items()}
    model = p.model_costs(prof.dim)
    run = Costs.per_dim(prof.dim, tier["fast"], tier["slow"]) if p.cost_source == "measure" else model
    cap = p.capacity(prof)
    variants = {}
    for name, plan in plans.items():
        variants[name] = metrics(plan, counts[name], prof, p.gpus, cap, p.batch, run, model)
        variants[name]["train_max_cost_ms"] = planned["train_max_cost_s"][name] * 1e3
    milp = planned["milp"]
    variants["recshard"].update(milp_solve_s=milp["solve_s"], milp_gap=milp["gap"], milp_optimal=float(milp["optimal"]))

    bandwidths = param_assumptions(p, "hbm_gb_s", "uvm_gb_s")
    if p.cost_source == "measure":
        access = {f"{level}_s_per_row_dim{d}": Assumption(value=tier[level][d], unit="s",
                                                          source=f"{level} tier, {tier['what']}")
                  for level in ("fast", "slow") for d in sorted(tier[level])}
    else:
        access = bandwidths
    assumptions = {**dict.fromkeys(BANDWIDTH_MODELLED, bandwidths), "embedding_throughput": access}
    shown = [n for n in plans if n != "greedy"]
    curves = [
        Curve(title="per-GPU lookup time (assumed HBM/UVM bandwidths)", x_label="GPU", y_label="ms per batch",
              series={n: (list(range(p.gpus)), (gpu_times(plans[n], counts[n], model, p.gpus).mean(0) * 1e3).tolist())
                      for n in shown}),
        Curve(title="slow-memory (UVM) accesses, held-out batches", x_label="batch", y_label="UVM accesses",
              series={n: (list(range(p.eval_batches)), counts[n][1].sum(1).astype(float).tolist()) for n in shown},
              log_y=True),
    ]
    source = (f"embedding_throughput uses per-access costs {tier['what']}: {tiers.describe(tier['fast'], tier['slow'])}"
              if p.cost_source == "measure" else
              "embedding_throughput uses the assumed bandwidths (cost_source=assumed); nothing was timed")
    notes = [
        "Throughputs are samples / (sum over held-out batches of the slowest GPU's lookup time), from exact "
        "HBM and UVM access counts of replaying a held-out trace (another seed) against each plan. " + source + ".",
        f"Assumed (not measured): HBM {p.hbm_gb_s:g} GB/s and UVM {p.uvm_gb_s:g} GB/s (H100 HBM3 and PCIe Gen5 x16 "
        f"peaks, ratio {p.hbm_gb_s / p.uvm_gb_s:.0f}x; the paper's V100 + PCIe 3 ratio is ~56x): the planner's cost "
        "model (for every plan) and modelled_throughput, load_imbalance (max/mean per-GPU time over the held-out "
        "trace) and the per-GPU curve.",
        f"MILP (HiGHS): {milp['status']} in {milp['solve_s']:.2f} s (limit {p.milp_time_limit_s:g} s), gap "
        f"{milp['gap']:.2%} (asked {p.milp_gap:g}); {p.num_tables} tables x {p.gpus} GPUs, {p.cdf_segments}-point "
        f"access CDFs, warm-started with the best greedy plan. Greedy = the {planned['best_greedy']}-balanced sharder, "
        f"best of size/lookup/size x lookup on the training trace (not on the held-out one).",
        f"Workload: {p.num_tables} tables, {prof.rows.sum():.3g} rows ({data['bytes'] / 1e9:.3g} GB), rows "
        f"{p.rows_min:g}..{p.rows_max:g}, pooling 1..{p.pooling_max:g}, coverage {p.coverage_min:g}..1, dims "
        f"{p.dims()[0]}..{p.dims()[-1]}, Zipf {p.hot_fraction:.0%} of rows -> {p.hot_share:.0%} of accesses; HBM "
        f"holds {p.hbm_fraction:.0%} of the tables. Profile: {p.train_batches} x {p.batch} samples; rows never "
        "seen in the profile stay in UVM, so a short profile leaves held-out UVM accesses the MILP did not see.",
    ]
    det = set(COUNTED) | set(BANDWIDTH_MODELLED) if milp["optimal"] else set()  # a time-limited MILP may stop at another incumbent
    if not milp["optimal"]:
        notes.append("The MILP hit its time limit: its plan (so every count-based metric) may differ run to run.")
    return SystemResult(variants=variants, kinds=KINDS, assumptions=assumptions, curves=curves, notes=notes,
                        deterministic=det)
