"""Slipstream flow: Hotline's pipeline skipping popular inputs that touch only stale hot rows, vs FAE,
Hotline (also the mechanism's ablation: Slipstream without skipping) and hybrid training, on the
family's two-tier trainer; the slow-tier regime sweep and a projection at HBM/host-memory constants."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.slipstream.result import build_result
from mlsys_flows.tasks import slipstream as t


@system_flow("slipstream")
def slipstream(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = ctx.submit(t.train, p, ctx.storage, data["key"], list(t.VARIANTS), ctx.devices,
                         device="gpu").result()
    sweep = ctx.submit(t.regime, p, ctx.storage, data["key"], list(t.REGIME_VARIANTS), ctx.devices,
                       device="gpu").result()
    return build_result(p, data, trained, sweep)
