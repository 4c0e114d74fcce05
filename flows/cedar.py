"""cedar flow: an image, a text and an audio pipeline, each run with torch DataLoader (its best
num_workers, persistent workers), cedar as written and cedar optimized on the same data. A pipeline
whose variants' outputs differ fails the run (the benchmark task raises OutputsDiffer)."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.cedar import PIPELINES
from mlsys_flows.systems.cedar.bench import summarize
from mlsys_flows.tasks import cedar as t


@system_flow("cedar")
def cedar(ctx: RunContext) -> SystemResult:
    p = ctx.params
    manifest = t.make_workload.submit(p, ctx.storage, ctx.key("data")).result()
    # one pipeline after the other: each benchmark is timed and must not share the CPU with the next
    results = {name: t.benchmark.submit(p, ctx.storage, manifest, name, ctx.key("cache", name)).result()
               for name in PIPELINES}
    variants, samples, curves, notes = summarize(results)
    # every metric is timed, and DataLoader's num_workers is chosen by timing the candidates
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, deterministic=set(),
                        kinds={"geomean_samples_per_s": "measured", "samples_per_s": "measured", "seconds": "measured",
                               "num_workers": "measured"})
