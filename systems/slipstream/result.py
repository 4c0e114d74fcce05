"""Slipstream's SystemResult from its tasks' outputs: the family's training result with the staleness
rule's picks and skips, the slow-tier regime and the projection (pure)."""
from __future__ import annotations

from mlsys_flows.systems.common.report import SystemResult
from mlsys_flows.systems.recsys_embeddings import experiment as ex

from . import SPEC, Params


def build_result(p: Params, data: dict, trained: dict, sweep: dict[float, dict[str, dict]]) -> SystemResult:
    """``data``: the dataset task's output; ``trained``: the training task's; ``sweep``: the regime
    task's. Raises ParityError on a parity miss."""
    result, first = ex.training_result(trained["runs"], p, data, trained["profiled"])
    s = first["slipstream"]
    result.notes.append(
        f"Slipstream warmed up {p.stale_warmup} steps, then snapshot the hot rows every {p.snapshot_every} steps and "
        f"measured each row's drift in units of the update scale (emb_lr x sqrt(dim) x {p.snapshot_every} steps: the "
        f"most row-wise Adagrad can move a row between snapshots); at each of its {s['stale_picks']:.0f} snapshots "
        f"it re-picked the threshold by the loss change skipping would cause: on {p.probe_samples} sampled popular "
        f"inputs, the largest drift quantile whose skipped inputs' mean loss under the current model stayed within "
        f"{1 + p.max_loss_increase:g}x the sample's (a forward pass, timed), capped at {p.max_skip} of the sample "
        f"(quantiles {s['stale_quantile_min']:.2f} to {s['stale_quantile_max']:.2f} were picked; the loss rule "
        f"stopped a larger threshold at {s['stale_bound_loss'] + s['stale_bound_both']:.0f} picks, the cap at "
        f"{s['stale_bound_cap'] + s['stale_bound_both']:.0f}, counted; the rule took {s['stale_rule_s']:.2f} s of its "
        f"training time, measured); last threshold {s['stale_threshold']:.3g}. Preparing its kept inputs again after "
        f"skips (dedup and tensor building, data-loader work as every variant's preparation) took "
        f"{s.get('prepare_s', 0.0):.2f} s, outside the clock (measured, not training time). "
        f"It skipped {s['skipped_fraction']:.1%} of all inputs "
        f"({s['popular_skipped']:.1%} of the popular ones, counted), and its final test logloss differs from "
        f"Hotline's by {s['test_logloss'] - first['hotline']['test_logloss']:+.4f}. Hotline is also the mechanism's "
        "ablation (Slipstream without skipping).")
    ex.add_regime(result, sweep, "train_time_s", p, SPEC,
                  extra_note=" The skipping variant's warm-up and snapshot interval shrink with the sweep's shorter "
                             "run (the same share of it).")
    result.projection = ex.projection(
        trained, p, "fae", "slipstream", True,
        "training seconds of the same epochs (accuracy parity enforced) against FAE with the hot rows in GPU HBM and "
        "the tables in host memory behind PCIe: this run's compute plus its counted rows moved at the stated per-row "
        "costs, Slipstream's gather hidden behind its popular micro-batch's compute")
    return result
