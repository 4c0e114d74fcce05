"""Hotline (ISCA 2024): each mini-batch splits into a popular micro-batch (every row hot) that trains
in the fast tier while the rest's cold rows are gathered from the slow tier in the background;
against hybrid training and FAE, on the family's shared two-tier trainer
(systems/recsys_embeddings). Pure: no prefect/dask imports."""
from __future__ import annotations

from typing import ClassVar

from mlsys_flows.systems.common.spec import Claim, SystemSpec
from mlsys_flows.systems.recsys_embeddings.params import FULL, SMOKE, HarnessParams


class Params(HarnessParams):
    SYSTEM: ClassVar[str] = "hotline"
    PRESETS: ClassVar[dict] = {"smoke": dict(SMOKE), "quick": dict(), "full": dict(FULL)}


SPEC = SystemSpec(
    name="hotline", title="Hotline: popular/non-popular micro-batch pipelining", paper="Hotline (ISCA 2024)",
    family="recsys-embeddings", params=Params, baselines=("hybrid", "fae"),
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

__all__ = ["Params", "SPEC"]
