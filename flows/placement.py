"""Device placement flow: the exact DP vs PipeDream, greedy, local search and one accelerator (and the
non-contiguous IP) on the authors' published graphs and torch.fx models; one task per graph."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.placement import FX_MODELS, graph_label, load
from mlsys_flows.systems.placement.result import build_result
from mlsys_flows.tasks import placement as t


@system_flow("placement")
def placement(ctx: RunContext):
    p = ctx.params
    names = [p.graph] + [g for g in p.graphs if g != p.graph]
    # files (a user's graph, the published ones) are read here, where the parameters were checked, not on
    # a worker that may not have them; the built-in torch models are built on the worker
    source = {g: g if g in FX_MODELS else load(g) for g in names}
    sweep = t.regime.submit(p, source[p.graph])  # the headline graph at every accelerator count, beside the solves
    futures = {g: t.solve.submit(p, ctx.storage, source[g], ctx.key(f"placement_{graph_label(g)}.json"))
               for g in names}
    results = {g: f.result() for g, f in futures.items()}
    return build_result(p, results, sweep.result())
