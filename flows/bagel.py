"""BAGEL flow: GP-UCB budgeted retrieval vs reranking the dense retriever's top-B, graph-based adaptive
re-ranking (GAR) and the dense retriever alone at equal scorer budget, on a MiniLM-embedded text corpus
(headline) and on digit embeddings (a second claim), with two distant relevant clusters per query; BAGEL's
UCB factor and GAR's batch and graph size are tuned on calibration queries first. The scorer is a noisy
label oracle or an OpenAI-compatible LLM."""
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
    key = t.make_workload.submit(p, ctx.storage, ctx.key("workload.pkl"), p.embedding)
    # the second workload (digits) when the headline runs on minilm; on digits the headline is that claim
    second = p.embedding != "digits"
    if second:
        dkey = t.make_workload.submit(p, ctx.storage, ctx.key("workload_digits.pkl"), "digits")
        dtuned = t.calibrate.submit(p, ctx.storage, dkey)
        dfut = [t.evaluate.submit(p, ctx.storage, dkey, dtuned, trial, 0, p.queries, claim=True)
                for trial in range(p.trials)]
    tuned = t.calibrate.submit(p, ctx.storage, key)
    futures = [[t.evaluate.submit(p, ctx.storage, key, tuned, trial, int(a), int(b))
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a] for trial in range(p.trials)]
    sweep = {c: t.regime.submit(p, ctx.storage, key, tuned, c) for c in p.regime_per_cluster}
    # the bridge between a query's two aspects re-graded to 0 (minilm only): how much of the win it carries
    bridge = t.same_city.submit(p, ctx.storage, key, tuned, 0.0) if p.embedding == "minilm" and p.same_city > 0 else None
    per_trial = [[f.result() for f in fs] for fs in futures]
    digits = ([[f.result()] for f in dfut], dtuned.result()) if second else None
    return build_result(p, per_trial, {c: f.result() for c, f in sweep.items()}, tuned.result(), digits,
                        bridge.result() if bridge is not None else None)
