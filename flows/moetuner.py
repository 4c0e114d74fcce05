"""MoETuner flow: ILP expert placement vs contiguous and greedy placement, on one and two nodes."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, system_flow
from mlsys_flows.systems.moetuner.result import SUFFIX, build_result
from mlsys_flows.tasks import moetuner as t


@system_flow("moetuner")
def moetuner(ctx: RunContext):
    p = ctx.params
    trace = t.make_trace.submit(p, ctx.storage, ctx.key("trace.npz"))
    # timed first, alone: the expert kernel on this machine (its cost per token prices the *_kernel variants)
    kern = t.kernel.submit(p).result()
    # the compared times are modelled from the trace, so the two setups may run side by side; the two-node
    # task also sweeps the inter-node bandwidth (the regime)
    futures = {s: t.place_and_evaluate.submit(p, ctx.storage, trace, s, ctx.key(f"plans_{s}.npz"),
                                              kern["us_per_token"] if s == "1node" else None, s == "2node")
               for s in SUFFIX}
    # paired repeats of the one-node headline, each on its own trace and split (seed + r); repeat 0 is above
    reps = [t.repeat_1node.submit(p, ctx.storage, r) for r in range(1, ctx.repeats)]
    done = {s: f.result() for s, f in futures.items()}
    return build_result(p, kern, done, [f.result() for f in reps])
