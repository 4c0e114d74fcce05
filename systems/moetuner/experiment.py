"""MoETuner's experiment: a recorded trace checked against the setups, every placement planned and
evaluated on the held-out tokens, and the bandwidth regime (numpy, the ILPs; the package itself
holds only Params and SPEC)."""
from __future__ import annotations

import numpy as np

from . import REGIME_VARIANTS, Params
from .evaluate import CostModel, Topology, end_to_end_s, evaluate, traffic
from .placement import check_placement, contiguous, greedy, map_clusters, moetuner
from .trace import RoutingTrace, TraceError, profile


def check_trace_fits(trace: RoutingTrace, p: Params) -> None:
    """A recorded trace must split evenly over both setups and leave a batch of held-out tokens."""
    if trace.num_experts % (2 * p.gpus_per_node):
        raise TraceError("num_experts", f"{trace.num_experts} experts do not split evenly over 1 and 2 nodes "
                                        f"of {p.gpus_per_node} GPUs (set gpus_per_node)")
    if trace.tokens * (1 - p.profile_fraction) < p.batch_tokens:
        raise TraceError("experts", f"{trace.tokens} tokens leave fewer than batch_tokens={p.batch_tokens} held out")


def plan_and_evaluate(p: Params, trace: RoutingTrace, setup: str, kernel_us_per_token: float | None = None) -> dict:
    """Profile on a share of tokens, place experts with each policy for one setup ('1node' or '2node'),
    evaluate every placement on the held-out tokens. Returns {variant: evaluation} plus plan stats.
    Variants: the baselines ``contiguous`` and ``greedy``, ``moetuner_ilp1`` (ILP 1's clusters labelled by
    their smallest expert id, no routing-aware placement of the clusters: the ablation),
    ``moetuner_rank_aligned`` (the same clusters on ILP 1's own load-rank labels) and ``moetuner``."""
    topo = p.topologies()[setup]
    prof_trace, held_out = trace.split(p.profile_fraction, p.seed)
    prof = profile(prof_trace)
    plans = {"contiguous": contiguous(trace.layers, trace.num_experts, topo.gpus),
             "greedy": greedy(prof, topo.gpus)}
    tuned = moetuner(prof, topo.pair_weight(), ilp1_time_limit_s=p.ilp1_time_limit_s,
                     ilp2_time_limit_s=p.ilp2_time_limit_s, ilp2_window=p.ilp2_window,
                     symmetric=topo.nodes == 1, seed=p.seed, follow_routing=p.ilp1_follow_routing,
                     load_slack=p.ilp1_load_slack)
    plans["moetuner_ilp1"] = tuned.ilp1_only
    plans["moetuner_rank_aligned"] = tuned.rank_aligned
    plans["moetuner"] = tuned.gpu_of
    out = {}
    for name, gpu_of in plans.items():
        check_placement(gpu_of, topo.gpus)
        out[name] = evaluate(held_out, gpu_of, topo, p.cost_model())
        out[name]["plan"] = gpu_of
    out["moetuner"]["metrics"].update(tuned.stats)
    out["moetuner"]["clusters"] = tuned.clusters
    if kernel_us_per_token is not None:  # the same plans priced with the expert kernel measured on this machine
        here = CostModel(kernel_us_per_token, p.non_moe_us_per_token, p.token_bytes, p.batch_tokens)
        for name in ("contiguous", "moetuner"):
            out[f"{name}_kernel"] = evaluate(held_out, plans[name], topo, here) | {"plan": plans[name]}
    return out


def bandwidth_regime(p: Params, trace: RoutingTrace, plans: dict[str, np.ndarray], clusters: np.ndarray,
                     done: dict[str, float]) -> dict[float, dict[str, float]]:
    """{intra/inter bandwidth ratio: {variant: end-to-end time}} of the two-node setup. Contiguous and greedy
    placements, ILP 1's clusters, the ablation (those clusters labelled by smallest expert id) and the
    rank-aligned placement (on ILP 1's own labels) do not depend on the links, so only the ILP 2 stage is re-planned at each ratio; ``done`` is the run's own two-node
    result, reused at its ratio."""
    prof_trace, held_out = trace.split(p.profile_fraction, p.seed)
    prof = profile(prof_trace)
    own = p.intra_node_gb_s / p.inter_node_gb_s
    g = 2 * p.gpus_per_node
    sizes = np.bincount(np.arange(held_out.tokens) // p.batch_tokens)
    fixed = {n: traffic(held_out, plans[n], g, p.batch_tokens) for n in REGIME_VARIANTS if n != "moetuner"}
    out = {}
    for r in p.regime_bandwidth_ratios:
        if abs(r - own) <= 1e-9 * own:
            out[r] = dict(done)
            continue
        topo = Topology(2, p.gpus_per_node, p.intra_node_gb_s, p.intra_node_gb_s / r)
        gpu_of, ablation, aligned = map_clusters(prof, clusters, topo.pair_weight(), ilp2_time_limit_s=p.ilp2_time_limit_s / 20,
                                        ilp2_window=p.ilp2_window, symmetric=False, seed=p.seed)
        if not (np.array_equal(ablation, plans["moetuner_ilp1"])
                and np.array_equal(aligned, plans["moetuner_rank_aligned"])):
            raise ValueError("the regime's clusters are not the ones the run's ablation was placed from")
        counts = fixed | {"moetuner": traffic(held_out, gpu_of, g, p.batch_tokens)}
        out[r] = {n: end_to_end_s(counts[n], sizes, topo, p.cost_model()) for n in REGIME_VARIANTS}
    return out
