"""cedar flow: an image, a text and an audio pipeline, each run with torch DataLoader (its best
num_workers, persistent workers), the caching DataLoader (its deterministic prefix cached in memory),
cedar as written and cedar optimized on the same data. A pipeline
whose variants' outputs differ fails the run (the benchmark task raises OutputsDiffer)."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.cedar import PIPELINES
from mlsys_flows.systems.cedar.result import build_result
from mlsys_flows.tasks import cedar as t


@system_flow("cedar")
def cedar(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    manifest = t.make_workload.submit(p, ctx.storage, ctx.key("data")).result()
    # one pipeline after the other: each benchmark is timed and must not share the CPU with the next
    results = {name: t.benchmark.submit(p, ctx.storage, manifest, name, ctx.key("cache", name)).result()
               for name in PIPELINES}
    sweep = t.regime.submit(p, ctx.storage, ctx.key("cache", "regime")).result()
    return build_result(p, results, sweep)
