"""cedar's SystemResult from its tasks' outputs (pure): the per-pipeline benchmarks, their aggregate
variants and the per-sample-cost regime."""
from __future__ import annotations

import statistics
from typing import Any

from mlsys_flows.systems.cedar import GEOMEAN, regime_items_at
from mlsys_flows.systems.cedar.bench import REGIME_VARIANTS, summarize
from mlsys_flows.systems.common.report import RegimeSample, SystemResult


def build_result(p: Any, results: dict[str, dict], sweep: dict) -> SystemResult:
    """``results``: pipeline name -> its benchmark task's output; ``sweep``: the regime task's output."""
    variants, samples, curves, notes = summarize(results)
    points = sweep["points"]
    # every regime run is timed end to end (the optimizer's warm-up hold included: cedar really pays it)
    regime = [RegimeSample(value=us, samples={v: list(pt[v]) for v in REGIME_VARIANTS}, kind="measured")
              for us, pt in points.items()]
    # where the headline's pipelines sit: their CPU cost per sample as written (one process, no rewrite)
    cost_us = 1e6 / statistics.median(samples["cedar"][GEOMEAN])
    notes.append(
        "Regime: a synthetic pipeline (deterministic featurize of a chosen CPU cost, "
        f"{sweep['round_us']:.2f} us per round measured on the worker; cheap random jitter; batches of {p.batch_size}; "
        f"{p.epochs} epochs) at per_sample_cpu_us = " + ", ".join(
            f"{us:g} ({regime_items_at(p, us)} samples, {sweep['rounds'][us]} rounds; DataLoader num_workers={pt['num_workers']:.0f}, caching DataLoader "
            f"num_workers={pt['cached_num_workers']:.0f}; optimizer: " + (", ".join(pt.get("applied", [])) or "no rewrite")
            + ")" for us, pt in points.items())
        + f"; {p.regime_repeats} interleaved run(s) of each of the DataLoader and the caching DataLoader (num_workers "
        "chosen on a calibration split of half the point's samples, other ids and another seed, each candidate's whole "
        "run timed, worker start-up and cache fill included), cedar as written and cedar optimized per point, the "
        "first variant rotating; no hindsight oracle in the regime (one num_workers per loader is timed); "
        "outputs not re-verified (the headline's pipelines are). The headline's value is the "
        f"geometric mean of its pipelines' cost per sample as written, {cost_us:.0f} us (1e6 / cedar's geomean "
        "samples/s).")
    # DataLoader's num_workers is chosen by timing the candidates, so nothing here is deterministic
    return SystemResult(variants=variants, samples=samples, curves=curves, notes=notes, deterministic=set(),
                        regime=regime, regime_headline_value=cost_us)
