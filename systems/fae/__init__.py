"""FAE (VLDB 2022): hot-embedding-aware training. Profile a share of the inputs, keep the hottest rows
that fit a fast-tier budget, train hot inputs entirely in the fast tier and cold ones hybrid, syncing
the hot rows at each phase switch; against hybrid (parameter-server style) training. The trainer is
the family's shared two-tier trainer (systems/recsys_embeddings). Pure: no prefect/dask imports."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from mlsys_flows.systems.common.spec import Claim, Mechanism, SystemSpec
from mlsys_flows.systems.recsys_embeddings.params import FULL, METRIC_KINDS, SMOKE, HarnessParams, slow_tier_regime

# the variants trained in the flow (interleaved repeats), and those run at each regime point
VARIANTS = ("hybrid", "fae", "cache")
REGIME_VARIANTS = ("hybrid", "fae", "cache")

class Params(HarnessParams):
    SYSTEM: ClassVar[str] = "fae"
    PRESETS: ClassVar[dict] = {"smoke": dict(SMOKE, budget_sweep_mb=(0.05,)), "quick": dict(repeats=6),
                               "full": dict(FULL, budget_sweep_mb=(8.0, 16.0, 32.0, 128.0))}

    budget_sweep_mb: tuple[float, ...] = Field(
        (0.25, 1.0, 2.0), max_length=8,
        description="Extra fast-tier budgets (MB) at which FAE's profile is ranked again: hot rows and hot-input "
                    "fraction per budget (counted, no training; the plot); empty: no sweep.")

    @field_validator("budget_sweep_mb")
    @classmethod
    def _budgets(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (0 < b <= 1e6) for b in v):
            raise ValueError(f"every budget must lie in (0, 1e6] MB (got {list(v)})")
        return tuple(sorted(set(v)))


SPEC = SystemSpec(
    name="fae", title="FAE: hot-embedding-aware training", paper="FAE (VLDB 2022)", family="recsys-embeddings",
    params=Params, baselines=("hybrid", "cache"),
    # hybrid has nothing to tune: it is the paper's CPU-GPU hybrid baseline and what a user runs without FAE
    # cache, FAE's ablation, is also what practitioners deploy: a static hot-row cache filled from a
    # profile of the training inputs (torchrec's UVM caching, HugeCTR), tuned on no evaluated data
    roles={"hybrid": ("paper", "deployable"), "cache": ("deployable",)},
    mechanism=Mechanism(
        "hot/cold input classification: hot inputs train in batches entirely on the fast tier",
        "cache",
        "cache keeps FAE's profiled hot rows in the fast tier (read and updated there) but drops the input "
        "classification and its phase schedule: batches in arrival order, each batch's cold rows gathered from the "
        "slow tier before it trains, no syncs (hybrid with FAE's hot set)"),
    regime=slow_tier_regime(),
    kinds=METRIC_KINDS,
    hardware=("HBM-resident hot tier, host-memory cold tier over PCIe",),
    claims=(
        Claim("time_to_logloss_s", "hybrid", "fae", "lower", 2.34,
              "2.34x faster training vs CPU-GPU hybrid at equal accuracy", headline=True),
        Claim("train_time_s", "hybrid", "fae", "lower",
              statement="training time of the same epochs (no accuracy target)"),
        Claim("test_logloss", "hybrid", "fae", "lower",
              statement="final test logloss at equal epochs (1.0: the same accuracy)"),
    ),
)

__all__ = ["Params", "SPEC", "VARIANTS", "REGIME_VARIANTS"]
