"""SIA flow: a string-key learned index served under read/insert mixes while its groups retrain on the
FPGA board, by SIA's memoised incremental QR vs a full QR of every key (SIndex-style), on YCSB-style and
Twitter-like keys; plus both schemes retraining inline on the host."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.sia.result import build_result
from mlsys_flows.tasks import sia as t


@system_flow("sia")
def sia(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    # one task, one board, the workloads one after the other (each is timed and must not share the CPU)
    results = ctx.submit(t.serve, p, ctx.storage, {"ycsb": p.inline_variants, "twitter": False}, ctx.devices,
                         ctx.key(), device="fpga").result()
    return build_result(p, results)
