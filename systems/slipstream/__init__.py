"""Slipstream (arXiv 2404.04270): snapshot the hot rows every S steps, measure each row's drift,
choose a staleness threshold on a sample and skip inputs that touch only stale rows; on Hotline's
pipeline in the family's shared two-tier trainer (systems/recsys_embeddings), against FAE, Hotline
and hybrid training. Pure: no prefect/dask imports."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from mlsys_flows.systems.common.spec import Claim, SystemSpec
from mlsys_flows.systems.recsys_embeddings.params import FULL, SMOKE, HarnessParams


class Params(HarnessParams):
    SYSTEM: ClassVar[str] = "slipstream"
    PRESETS: ClassVar[dict] = {"smoke": dict(SMOKE, snapshot_every=3), "quick": dict(),
                               "full": dict(FULL, snapshot_every=100)}

    snapshot_every: int = Field(10, ge=1, le=1_000_000, description="Steps between snapshots of the hot rows (drift is "
                                "measured between consecutive snapshots; the threshold is chosen at the second).")
    max_skip: float = Field(0.3, ge=0, lt=1, description="The threshold is the largest sampled drift quantile whose "
                            "share of skipped inputs, on a sample of training inputs, stays within this.")


SPEC = SystemSpec(
    name="slipstream", title="Slipstream: skipping stale-embedding inputs", paper="arXiv:2404.04270",
    family="recsys-embeddings", params=Params, baselines=("fae", "hotline", "hybrid"),
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

__all__ = ["Params", "SPEC"]
