"""Hotline (ISCA 2024): each mini-batch splits into a popular micro-batch (every row hot) that trains
in the fast tier while the rest's cold rows are gathered from the slow tier in the background;
against hybrid training and FAE, on the family's shared two-tier trainer
(systems/recsys_embeddings). Pure: no prefect/dask imports."""
from __future__ import annotations

from typing import ClassVar

from mlsys_flows.systems.common.spec import Claim, Mechanism, SystemSpec
from mlsys_flows.systems.recsys_embeddings.params import FULL, METRIC_KINDS, SMOKE, HarnessParams, slow_tier_regime

# the variants trained in the flow (interleaved repeats), and those run at each regime point
VARIANTS = ("hybrid", "fae", "hotline", "hotline_sync")
REGIME_VARIANTS = ("hybrid", "fae", "hotline", "hotline_sync")


class Params(HarnessParams):
    SYSTEM: ClassVar[str] = "hotline"
    ADAPTIVE: ClassVar[bool] = True  # samples/s: each run reports it
    PRESETS: ClassVar[dict] = {"smoke": dict(SMOKE), "quick": dict(max_repeats=12, repeat_budget_s=150),
                               "full": dict(FULL, max_repeats=20)}


SPEC = SystemSpec(
    name="hotline", title="Hotline: popular/non-popular micro-batch pipelining", paper="Hotline (ISCA 2024)",
    family="recsys-embeddings", params=Params, baselines=("hybrid", "fae"),
    # neither is tuned on the evaluated data: hybrid has nothing to tune, FAE's hot rows come from its
    # profile of a sample of the training inputs (the same profile Hotline uses)
    roles={"hybrid": ("paper", "deployable"), "fae": ("paper", "deployable")},
    mechanism=Mechanism(
        "the background gather of the cold rows, overlapped with the popular micro-batch's compute",
        "hotline_sync",
        "hotline_sync is the same pipeline (popular and non-popular micro-batches, hot rows in the fast tier, one "
        "update per step) with the non-popular micro-batch's cold rows gathered inline, before the popular "
        "micro-batch trains: only the overlap is removed"),
    regime=slow_tier_regime(),
    kinds=METRIC_KINDS,
    hardware=("HBM-resident hot tier, host-memory cold tier over PCIe",),
    claims=(
        Claim("samples_per_s", "hybrid", "hotline", "higher", 2.2,
              "2.2x vs Intel-optimized CPU-GPU DLRM (end-to-end training time, same accuracy)", headline=True),
        Claim("samples_per_s", "fae", "hotline", "higher",
              statement="against FAE's hot/cold phases on the same trainer"),
        Claim("time_to_logloss_s", "hybrid", "hotline", "lower",
              statement="training time to the same test logloss"),
        Claim("test_logloss", "hybrid", "hotline", "lower",
              statement="final test logloss at equal epochs (1.0: the same accuracy)"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS", "REGIME_VARIANTS"]
