"""FlexShard flow: tiered row-level sharding vs row-wise mod sharding of sequence embedding tables, at equal
per-device memory (the row-wise baselines spend FlexShard's extra memory on a hot-row cache), with and
without a deduplicating all-to-all."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.flexshard.result import build_result
from mlsys_flows.tasks import flexshard as t


@system_flow("flexshard")
def flexshard(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    data = t.make_workload.submit(p, ctx.storage, ctx.key("trace")).result()
    swept = t.regime.submit(p)  # counted, independent of the headline's workload: beside it
    plans = t.plan.submit(p, ctx.storage, data, ctx.key("plans.npz")).result()
    # byte counts and modelled times only: the replay chunks may run side by side
    chunks = [f.result() for f in [t.replay.submit(p, ctx.storage, data, plans, c) for c in data["chunks"]]]
    return build_result(p, plans, chunks, swept.result())
