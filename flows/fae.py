"""FAE flow: hot-embedding-aware training (hot batches in the fast tier, cold ones hybrid, hot rows
synced at phase switches) vs hybrid training and FAE's mechanism ablation (the same hot rows as a
cache, no input classification), on the family's two-tier trainer; the slow-tier regime sweep, a
projection at HBM/host-memory constants and a counted budget sweep."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.fae.result import build_result
from mlsys_flows.tasks import fae as t


@system_flow("fae")
def fae(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = ctx.submit(t.train, p, ctx.storage, data["key"], list(t.VARIANTS), ctx.devices,
                         device="gpu").result()  # timed: nothing else runs beside it
    sweep = ctx.submit(t.regime, p, ctx.storage, data["key"], list(t.REGIME_VARIANTS), ctx.devices,
                       device="gpu").result()
    points = t.budget_sweep.submit(p, ctx.storage, data["key"]).result() if p.budget_sweep_mb else []
    return build_result(p, data, trained, sweep, points)
