"""COMM-RAND flow: GraphSAGE mini-batch training on a community-ordered SBM graph with random batching,
pure community order, COMM-RAND batching and its fixed-order ablation (learning rates calibrated per
policy); time to a target accuracy, epoch time, final accuracy and the counted reasons (unique nodes,
feature rows, pages of the feature array touched); the regime over community size in batches."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.commrand.result import build_result
from mlsys_flows.tasks import commrand as t


@system_flow("commrand")
def commrand(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    graph = t.make_graph.submit(p, ctx.storage, ctx.key("graph.npz")).result()
    # each policy's learning rate, on a calibration graph and seed the evaluation never sees
    cal = t.calibrate.submit(p).result()
    # one task trains every policy in turn: timed runs must not share the CPU with each other
    r = t.train.submit(p, ctx.storage, graph, cal["lrs"], cal.get("k")).result()
    # the regime after the headline's training, never beside it (both are timed); each size calibrates its own
    # rates, and the headline's size (where the regime's graphs are the headline's) is the headline's comparison
    sweep = t.regime.submit(p).result()
    return build_result(p, graph, r, sweep, cal)
