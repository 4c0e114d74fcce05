"""BAGEL flow: GP-UCB budgeted retrieval vs reranking the dense retriever's top-B at equal scorer budget,
and the dense retriever alone, on digit embeddings or a MiniLM-embedded text corpus with two distant
relevant clusters per query; the scorer is a noisy label oracle or an OpenAI-compatible LLM."""
from __future__ import annotations

import numpy as np

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.bagel.result import build_result
from mlsys_flows.tasks import bagel as t

CHUNKS = 2  # query chunks per trial (one per core with a single trial)


@system_flow("bagel")
def bagel(ctx: RunContext):
    p = ctx.params
    chunks = CHUNKS if p.trials == 1 else 1
    bounds = np.linspace(0, p.queries, chunks + 1).astype(int)
    futures = []
    for trial in range(p.trials):
        key = t.make_workload.submit(p, ctx.storage, ctx.key("workload.pkl" if trial == 0 else f"workload_{trial}.pkl"),
                                     trial)
        futures.append([t.evaluate.submit(p, ctx.storage, key, int(a), int(b))
                         for a, b in zip(bounds[:-1], bounds[1:]) if b > a])
    sweep = {c: t.regime.submit(p, c) for c in p.regime_per_cluster}
    per_trial = [[f.result() for f in fs] for fs in futures]
    return build_result(p, per_trial, {c: f.result() for c, f in sweep.items()})
