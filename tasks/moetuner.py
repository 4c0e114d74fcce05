"""Prefect tasks of the MoETuner flow: build (or load) the routing trace, then place and evaluate."""
from __future__ import annotations

import io

import numpy as np
from prefect import get_run_logger, task

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.moetuner import (REGIME_VARIANTS, Params, RoutingTrace, TraceError, bandwidth_regime, check_trace_fits,
                                          plan_and_evaluate)
from mlsys_flows.systems.moetuner.kernel import measure_expert_us_per_token
from mlsys_flows.systems.moetuner.result import LATENCY_QUANTILES, SAMPLED


@task(name="moetuner-trace")
def make_trace(p: Params, storage: ObjectStorage, key: str) -> str:
    """The synthetic trace, or the recorded one at ``p.trace_key``, validated and saved at ``key``."""
    log = get_run_logger()
    if p.trace_key:
        if not storage.exists(p.trace_key):
            raise TraceError("trace_key", f"no object {p.trace_key!r} on storage {storage.root_url}")
        trace = RoutingTrace.from_npz(storage.read_bytes(p.trace_key))
    else:
        trace = p.make_trace()
    check_trace_fits(trace, p)
    storage.write_bytes(key, trace.to_npz())
    log.info("routing trace: %d tokens, %d layers, %d experts, top-%d", trace.tokens, trace.layers,
             trace.num_experts, trace.top_k)
    return key


@task(name="moetuner-kernel")
def kernel(p: Params) -> dict:
    """Time one expert FFN on this machine (the expert cost per token, measured)."""
    k = measure_expert_us_per_token(p.token_bytes // 2, p.expert_d_ff, seed=p.seed)
    get_run_logger().info("expert kernel: %.1f us per token (%.1f GFLOP/s, %d threads)", k["us_per_token"],
                          k["gflop_s"], k["threads"])
    return k


@task(name="moetuner-place-evaluate")
def place_and_evaluate(p: Params, storage: ObjectStorage, trace_key: str, setup: str, plan_key: str,
                       kernel_us_per_token: float | None = None, regime: bool = False) -> dict:
    """Profile, run both ILPs and the baselines for one setup, evaluate on held-out tokens; with ``regime``
    also the two-node setup at every bandwidth ratio of the sweep (under the key "regime")."""
    log = get_run_logger()
    trace = RoutingTrace.from_npz(storage.read_bytes(trace_key))
    result = plan_and_evaluate(p, trace, setup, kernel_us_per_token)
    clusters = result["moetuner"].pop("clusters")
    sweep = None
    if regime:
        sweep = bandwidth_regime(p, trace, {n: r["plan"] for n, r in result.items()}, clusters,
                                 {n: result[n]["metrics"]["end_to_end_time_s"] for n in REGIME_VARIANTS})
        for ratio, times in sweep.items():
            log.info("bandwidth ratio %g: contiguous/moetuner %.3f, moetuner_ilp1/moetuner %.3f", ratio,
                     times["contiguous"] / times["moetuner"], times["moetuner_ilp1"] / times["moetuner"])
    buf = io.BytesIO()
    np.savez_compressed(buf, **{name: r["plan"] for name, r in result.items()})
    storage.write_bytes(plan_key, buf.getvalue())
    m = result["moetuner"]["metrics"]
    log.info("%s: ILP 1 max gap %.3g (%.1f s), ILP 2 gap %.3g (%.1f s); end-to-end contiguous %.4g s, "
             "moetuner %.4g s", setup, m["ilp1_max_gap"], m["ilp1_solve_s"], m["ilp2_gap"], m["ilp2_solve_s"],
             result["contiguous"]["metrics"]["end_to_end_time_s"], m["end_to_end_time_s"])
    out = {name: {"metrics": r["metrics"],
                  "layer_time_s": r["layer_time_s"].tolist(),
                  "latency_quantiles_s": np.quantile(r["token_latency_s"], LATENCY_QUANTILES).tolist()}
           for name, r in result.items()}
    return {"variants": out, "regime": sweep}


@task(name="moetuner-repeat-1node")
def repeat_1node(p: Params, storage: ObjectStorage, repeat: int) -> dict:
    """One paired repeat of the one-node headline: the trace (synthetic: drawn at seed + repeat; recorded:
    the same trace) split into profile and held-out tokens at seed + repeat, every variant planned and
    evaluated on it. Returns {variant: {metric: value}} of the sampled metrics."""
    q = p.model_copy(update={"seed": p.seed + repeat})
    trace = RoutingTrace.from_npz(storage.read_bytes(p.trace_key)) if p.trace_key else q.make_trace()
    check_trace_fits(trace, q)
    result = plan_and_evaluate(q, trace, "1node")
    get_run_logger().info("repeat %d (seed %d): contiguous/moetuner %.3f, moetuner_ilp1/moetuner %.3f", repeat,
                          q.seed, *(result[n]["metrics"]["end_to_end_time_s"] / result["moetuner"]["metrics"]
                                    ["end_to_end_time_s"] for n in ("contiguous", "moetuner_ilp1")))
    return {n: {m: r["metrics"][m] for m in SAMPLED} for n, r in result.items()}
