"""AI Metropolis flow: out-of-order cluster scheduling vs global synchronization and the oracle,
on the simulated clock (plan) and for real on Dask (every LLM call generated on a small pretrained
model behind a batching server, or slept through)."""
from __future__ import annotations

import time

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.metropolis import POLICIES
from mlsys_flows.systems.metropolis.result import build_result
from mlsys_flows.tasks import metropolis as t


@system_flow("metropolis")
def metropolis(ctx: RunContext):
    p = ctx.params
    # every repeat is its own town (seed + repeat): its plan on the simulated clock and its true clusters
    truth_keys = [ctx.key(f"true_clusters-{r}.json") for r in range(ctx.repeats)]
    sweep = t.regime.submit(p, ctx.repeats)  # the radius sweep on the simulated clock, beside the plans
    plans = [t.plan.submit(p, ctx.storage, key, r) for r, key in enumerate(truth_keys)]
    planned = [f.result() for f in plans]
    regime = sweep.result()  # done before any timed run: nothing else shares the machine with them

    # the cost of one Prefect task on this runner: why cluster steps are not Prefect tasks
    probe = []
    for i in range(p.overhead_probe_tasks):
        t0 = time.perf_counter()
        t.noop.submit(i).result()
        probe.append(time.perf_counter() - t0)

    # an untimed warm-up on a town no repeat evaluates (its own cache key): the first timed run in a fresh
    # worker was the slowest of its policy in both of the branch's quick runs
    if p.llm == "smollm2" and p.warmup_steps:
        warm = p.model_copy(update={"steps": p.warmup_steps})
        t.run_schedule.submit(warm, POLICIES[0], ctx.storage, truth_keys[0], ctx.repeats).result()

    # the timed runs, one at a time, the policies' order rotating every repeat
    runs: dict[str, list[dict]] = {name: [] for name in POLICIES}
    for r in range(ctx.repeats):
        order = POLICIES[r % len(POLICIES):] + POLICIES[:r % len(POLICIES)]
        for name in order:
            runs[name].append(t.run_schedule.submit(p, name, ctx.storage, truth_keys[r], r).result())
    return build_result(p, planned, probe, runs, regime)
