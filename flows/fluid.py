"""FLuID flow: Invariant Dropout vs FedAvg waiting for every client, random dropout and ordered dropout,
federated on non-IID load_digits clients whose local rounds run as Dask tasks and whose speeds change
between rounds; FLuID with its stragglers fixed once from the profile is the re-detection's ablation."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.fluid import POLICIES
from mlsys_flows.systems.fluid.result import build_result
from mlsys_flows.tasks import fluid as t


@system_flow("fluid")
def fluid(ctx: RunContext):
    p = ctx.params
    seeds = [p.seed + i for i in range(ctx.repeats)]
    # every (seed, policy) federation at once: their clock is each client's own CPU time, not wall time
    futures = {(s, pol): t.federate.submit(p, pol, s, ctx.storage, ctx.key(f"history_{pol}_seed{s}.json"))
               for s in seeds for pol in POLICIES}
    runs = {k: f.result() for k, f in futures.items()}
    fanout = t.fanout_timing.submit(p, 3).result() if p.compare_workers else None  # alone: wall clock
    return build_result(p, seeds, runs, fanout)
