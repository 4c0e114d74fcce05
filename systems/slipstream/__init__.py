"""Slipstream (arXiv 2404.04270): after a warm-up, snapshot the hot rows every S steps, measure each
row's drift in units of the update scale, re-pick a staleness threshold at every snapshot by the loss
change skipping would cause on a sample of popular inputs, and skip the popular inputs that touch only
stale rows; on Hotline's pipeline in the family's shared
two-tier trainer (systems/recsys_embeddings), against FAE, Hotline and hybrid training. Pure: no
prefect/dask imports."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from mlsys_flows.systems.common.spec import Claim, Mechanism, SystemSpec
from mlsys_flows.systems.recsys_embeddings.params import FULL, METRIC_KINDS, SMOKE, HarnessParams, slow_tier_regime

# the variants trained in the flow (interleaved repeats), and those run at each regime point
VARIANTS = ("hybrid", "fae", "hotline", "slipstream")
REGIME_VARIANTS = ("hybrid", "fae", "hotline", "slipstream")


class Params(HarnessParams):
    SYSTEM: ClassVar[str] = "slipstream"
    # quick trains 3 epochs: the nearest to the workload's Bayes logloss its budget allows (more epochs overfit)
    PRESETS: ClassVar[dict] = {"smoke": dict(SMOKE, snapshot_every=2, stale_warmup=2),
                               "quick": dict(repeats=6, epochs=3),
                               "full": dict(FULL, snapshot_every=100, stale_warmup=200)}

    snapshot_every: int = Field(10, ge=1, le=1_000_000, description="Steps between snapshots of the hot rows (drift is "
                                "measured between consecutive snapshots and the threshold re-picked at each).")
    stale_warmup: int = Field(20, ge=0, le=10_000_000, description="Steps before the first snapshot: while the rows "
                              "settle from their init every row drifts, so no row is judged stale before.")
    max_loss_increase: float = Field(
        0.0, ge=-0.5, le=1.0,
        description="The threshold is the largest sampled drift quantile whose skipped popular inputs (those whose "
                    "every row is hot, the only skippable ones) have a mean loss, under the current model, at most "
                    "(1 + this) times the mean loss of the whole sample: a skipped input goes untrained, which costs "
                    "little only once the model has learned it. 0: no worse than the average input; negative: "
                    "better learned than average.")
    probe_samples: int = Field(1024, ge=16, le=1_000_000, description="Popular inputs sampled at each threshold pick: "
                               "their drift gives the candidate thresholds and the current model's loss on them (one "
                               "forward pass, no gradient, timed as Slipstream's cost) decides among the candidates.")
    max_skip: float = Field(0.5, ge=0, lt=1, description="Safety cap: the threshold never skips more than this share of "
                            "the sampled popular inputs, whatever their loss.")


SPEC = SystemSpec(
    name="slipstream", title="Slipstream: skipping stale-embedding inputs", paper="arXiv:2404.04270",
    family="recsys-embeddings", params=Params, baselines=("fae", "hotline", "hybrid"),
    # none is tuned on the evaluated data: hybrid has nothing to tune; FAE and Hotline use the hot rows of
    # their profile of a sample of the training inputs (the same profile Slipstream uses)
    roles={"fae": ("paper", "deployable"), "hotline": ("paper", "deployable"), "hybrid": ("paper", "deployable")},
    mechanism=Mechanism(
        "skipping the popular inputs whose every row is stale (drift below the threshold)",
        "hotline",
        "Slipstream without skipping is Hotline's pipeline with the same hot rows, run beside it on the same inputs: "
        "the only difference is the skipping (and its snapshots)"),
    regime=slow_tier_regime(),
    kinds=METRIC_KINDS,
    hardware=("HBM-resident hot tier, host-memory cold tier over PCIe",),
    claims=(
        Claim("time_to_logloss_s", "fae", "slipstream", "lower", 1.2,
              "2x vs XDL, 1.2x vs FAE, 1.175x vs Hotline (training time at the same accuracy)", headline=True),
        Claim("time_to_logloss_s", "hotline", "slipstream", "lower", 1.175, "1.175x vs Hotline"),
        Claim("time_to_logloss_s", "hybrid", "slipstream", "lower",
              statement="against hybrid training (the paper's XDL-style baseline: 2x)"),
        Claim("test_logloss", "hotline", "slipstream", "lower",
              statement="final-loss difference from skipping: test logloss at equal epochs vs Hotline (1.0: none)"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS", "REGIME_VARIANTS"]
