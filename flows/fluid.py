"""FLuID flow: Invariant Dropout vs FedAvg waiting for every client, FedAvg dropping its slowest clients
(drop fraction tuned on calibration seeds first), random dropout and ordered dropout, federated on
non-IID load_digits clients whose local rounds run as Dask tasks and whose speeds change between rounds;
FLuID with its stragglers fixed once from the profile is the re-detection's ablation. The regime re-runs
FLuID and its deployable baselines at each straggler slowdown, each run stopping at its seed's target
(FedAvg-wait, whose training does not depend on the speeds, is re-timed)."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.fluid import POLICIES, REGIME_RERUN
from mlsys_flows.systems.fluid.result import build_result, seed_target, tuned_drop_fraction
from mlsys_flows.tasks import fluid as t


@system_flow("fluid")
def fluid(ctx: RunContext):
    p = ctx.params
    seeds = [p.seed + i for i in range(ctx.repeats)]
    cal = p.calibration_seed_list()
    # every (seed, policy) federation at once: their clock is each client's own CPU time, not wall time;
    # fedavg_drop waits for its drop fraction, tuned on the calibration seeds (their FedAvg-wait run sets
    # each one's target, then every drop fraction of the grid runs until it reaches it)
    cal_wait = {s: t.federate.submit(p, "fedavg_wait", s, ctx.storage, ctx.key(f"calibration_fedavg_wait_seed{s}.json"))
                for s in cal}
    futures = {(s, pol): t.federate.submit(p, pol, s, ctx.storage, ctx.key(f"history_{pol}_seed{s}.json"))
               for s in seeds for pol in POLICIES if pol != "fedavg_drop"}
    cal_targets = {s: seed_target(p, f.result()) for s, f in cal_wait.items()}
    cal_drop = {(s, d): t.federate.submit(p, "fedavg_drop", s, ctx.storage,
                                          ctx.key(f"calibration_fedavg_drop{d:g}_seed{s}.json"), d, cal_targets[s])
                for s in cal for d in p.drop_fractions}
    # the regime: the federation re-run at each other slowdown, each run stopping at its seed's target; every
    # policy but fedavg_drop (which waits for its tuned fraction) is submitted while the calibration runs
    targets = {s: seed_target(p, futures[s, "fedavg_wait"].result()) for s in seeds}
    others = [k for k in p.regime_straggler_slowdown if k != p.straggler_slowdown]

    def rerun(k, s, pol, drop=None):
        return t.federate.submit(p.at_slowdown(k), pol, s, ctx.storage, ctx.key(f"regime_x{k:g}_{pol}_seed{s}.json"),
                                 drop, targets[s])
    reg = {(k, s, pol): rerun(k, s, pol) for k in others for s in seeds for pol in REGIME_RERUN if pol != "fedavg_drop"}
    calibration = {k: f.result() for k, f in cal_drop.items()}
    drop = tuned_drop_fraction(p, cal_targets, calibration)
    futures |= {(s, "fedavg_drop"): t.federate.submit(p, "fedavg_drop", s, ctx.storage,
                                                      ctx.key(f"history_fedavg_drop_seed{s}.json"), drop)
                for s in seeds}
    reg |= {(k, s, "fedavg_drop"): rerun(k, s, "fedavg_drop", drop) for k in others for s in seeds}
    runs = {k: f.result() for k, f in futures.items()}
    regime_runs = {k: f.result() for k, f in reg.items()}
    fanout = t.fanout_timing.submit(p, 3).result() if p.compare_workers else None  # alone: wall clock
    return build_result(p, seeds, runs, fanout, regime_runs=regime_runs, calibration=(cal_targets, calibration, drop))
