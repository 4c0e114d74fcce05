"""RadixAttention flow: SmolLM2-135M-Instruct served with the radix KV cache, without a cache and with
vLLM's block-hash prefix cache (FCFS, and with longest-prefix-match-first admission) on multi-turn
chat (the headline), few-shot, tree-of-thought, no-sharing and cache-pressure workloads, then the
shared-prefix regime."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.radix.result import build_result
from mlsys_flows.systems.radix.run import WORKLOADS
from mlsys_flows.tasks import radix as t


@system_flow("radix")
def radix(ctx: RunContext):
    p = ctx.params
    # one workload at a time: every pass is timed and must not share the CPU with another
    results = {w: t.serve_workload.submit(p, w).result() for w in WORKLOADS}
    sweep = t.regime.submit(p).result()  # after the workloads, alone too: it is timed
    return build_result(p, results, sweep)
