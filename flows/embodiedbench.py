"""EmbodiedBench flow: fixed seeded test sets (one per seed) of both levels (high: household, low: grid
navigation and manipulation; six capability subsets each); the language agent (SmolLM2 by default) with and
without environment feedback (and with the same plan budget without it), the scripted reference and the
expert, episodes in parallel Dask chunks; ERA's learned policies trained per level and played on every test
set; counted success per level and subset with one sample per test set, the round-budget regime, invalid
plans and their reasons."""
from __future__ import annotations

import numpy as np

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.embodiedbench import LEVELS, SUBSETS, eval_seeds
from mlsys_flows.systems.embodiedbench.result import build_result
from mlsys_flows.tasks import embodiedbench as t


@system_flow("embodiedbench")
def embodiedbench(ctx: RunContext):
    p = ctx.params
    n = p.per_subset * len(SUBSETS)
    futures = [t.era_policies.submit(p, ctx.storage, level, ctx.key(f"episodes_era_{level}.json")) for level in LEVELS]
    bounds = np.linspace(0, n, min(p.chunks, n) + 1).astype(int)
    for seed in eval_seeds(p):
        for level in LEVELS:
            futures += [t.run_episodes.submit(p, ctx.storage, level, seed, int(a), int(b),
                                              ctx.key(f"episodes_{level}_seed{seed}_{i}.json"))
                        for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]
    parts = [f.result() for f in futures]
    return build_result(p, parts)
