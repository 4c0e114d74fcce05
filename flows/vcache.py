"""vCache flow: the verified semantic cache vs static similarity thresholds, on synthetic sphere streams
(several seeds, each with a static threshold calibrated on held-out traffic of its world and the hindsight
one beside it, the global-threshold ablation, a class-confusion sweep) and on real MiniLM embeddings of
paraphrase sets."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.vcache.result import build_result
from mlsys_flows.tasks import vcache as t


@system_flow("vcache")
def vcache(ctx: RunContext):
    p = ctx.params
    minilm = t.minilm_stream.submit(p, ctx.storage, ctx.key("minilm.npz"))
    mini = {which: t.replay.submit(p, ctx.storage, minilm, which) for which in ("vcache", "static")}
    sweep_regime = {w: t.regime.submit(p, w) for w in p.regime_near_dup}
    seeds = [t.sphere_seed.submit(p, i, t.calibrate.submit(p, i)) for i in range(p.seeds)]
    per_seed = [f.result() for f in seeds]
    return build_result(p, per_seed, {which: f.result() for which, f in mini.items()},
                        {w: f.result() for w, f in sweep_regime.items()})
