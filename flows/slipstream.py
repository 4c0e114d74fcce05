"""Slipstream flow: Hotline's pipeline skipping popular inputs that touch only stale hot rows, vs FAE,
Hotline (also the mechanism's ablation: Slipstream without skipping) and hybrid training, on the
family's two-tier trainer; the slow-tier regime sweep and a projection at HBM/host-memory constants."""
from __future__ import annotations

from mlsys_flows.flows.common import RunContext, SystemResult, system_flow
from mlsys_flows.systems.common.report import Projection
from mlsys_flows.systems.recsys_embeddings.experiment import (build_result, projected_time, projection_assumptions,
                                                              regime_result)
from mlsys_flows.tasks import slipstream as t


@system_flow("slipstream")
def slipstream(ctx: RunContext) -> SystemResult:
    p = ctx.params
    data = t.make_dataset.submit(p, ctx.storage, ctx.key("data.npz")).result()
    trained = ctx.submit(t.train, p, ctx.storage, data["key"], list(t.VARIANTS), ctx.devices,
                         device="gpu").result()
    sweep = ctx.submit(t.regime, p, ctx.storage, data["key"], list(t.REGIME_VARIANTS), ctx.devices,
                       device="gpu").result()
    runs = trained["runs"]
    result, first = build_result(runs, p, data, trained["profiled"])
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
        f"training time, measured); last threshold {s['stale_threshold']:.3g}. "
        f"It skipped {s['skipped_fraction']:.1%} of all inputs "
        f"({s['popular_skipped']:.1%} of the popular ones, counted), and its final test logloss differs from "
        f"Hotline's by {s['test_logloss'] - first['hotline']['test_logloss']:+.4f}. Hotline is also the mechanism's "
        "ablation (Slipstream without skipping).")
    result.regime, note = regime_result(sweep, "train_time_s", p)
    result.regime_headline_value = 0.0
    result.notes.append(note + " The skipping variant's warm-up and snapshot interval shrink with the sweep's "
                               "shorter run (the same share of it).")
    base, tech = projected_time(runs["fae"], p, False), projected_time(runs["slipstream"], p, True)
    result.projection = Projection(
        baseline_value=base, technique_value=tech, assumptions=projection_assumptions(p, trained["device"]),
        statement="training seconds of the same epochs (accuracy parity enforced) against FAE with the hot rows in "
                  "GPU HBM and the tables in host memory behind PCIe: this run's compute plus its counted rows moved "
                  "at the stated per-row costs, Slipstream's gather hidden behind its popular micro-batch's compute")
    return result
