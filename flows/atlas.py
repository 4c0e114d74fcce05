"""Atlas flow: causal graphs synthesized from component documentation (a learned MiniLM sentence rule
fitted on calibration pages, or an OpenAI-compatible model, one request per component; the scripted
parser as a labelled reference) and validated by conditional-independence tests,
vs the PC algorithm learned from the same short telemetry window, z-score ranking and the true graph;
the same localizer ranks every incident's root cause on every graph."""
from __future__ import annotations

import numpy as np

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.atlas.result import build_result
from mlsys_flows.tasks import atlas as t


@system_flow("atlas")
def atlas(ctx: RunContext):  # returns the SystemResult its package assembles
    p = ctx.params
    seeds = [p.seed * 100 + k for k in range(p.systems)]
    rule = None if p.llm_base_url else t.calibrate.submit(p)
    learned = {s: t.learn.submit(p, ctx.storage, s, ctx.key(f"system_{s}.pkl"), rule) for s in seeds}
    bounds = np.linspace(0, p.incidents, p.incident_chunks + 1).astype(int)
    chunks = {s: [t.rank.submit(p, ctx.storage, ctx.key(f"system_{s}.pkl"), s, int(a), int(b), wait_for=[learned[s]])
                  for a, b in zip(bounds[:-1], bounds[1:]) if b > a] for s in seeds}
    systems = [{"learned": learned[s].result(), "incidents": [f.result() for f in chunks[s]]} for s in seeds]
    return build_result(p, systems)
