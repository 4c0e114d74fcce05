"""PHAZE flow: equal-area accelerator designs evaluated as parallel Dask tasks (per-layer scheduling ILP
+ data/pipeline/tensor placement DP each), the co-searched design vs a TPUv4-like chip and vs the best
single chip placed afterwards, on transformer block stacks (GPT, Llama or parallel-attention blocks) at two sizes."""
from __future__ import annotations

import time

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.phaze.result import build_result
from mlsys_flows.tasks import phaze as t


@system_flow("phaze")
def phaze(ctx: RunContext):
    p = ctx.params
    designs = p.designs()
    # the fan-out: one task per candidate design, all submitted before any result is awaited
    started = time.perf_counter()
    futures = {a.name: t.evaluate_candidate.submit(p, a, ctx.storage, ctx.key("designs", f"{a.name}.json"))
               for a in designs}
    results = {name: f.result() for name, f in futures.items()}
    search_s = time.perf_counter() - started
    return build_result(p, results, search_s)
