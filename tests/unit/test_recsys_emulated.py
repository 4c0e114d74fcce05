"""Contract v4's ``emulated`` kind in the embedding-tier systems (issue 44, item 1's labelling): a regime
point whose slow tier was made slower by the tier process sleeping (``slow_row_us`` > 0) is emulated,
never measured, in FAE, Hotline and Slipstream (the three that sleep); RecShard's regime is modelled
and injects no sleep."""
from __future__ import annotations

import importlib
import pathlib

import numpy as np
import pytest

from mlsys_flows.systems.common.report import ContractError, SystemResult, _check_emulated
from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.tier import SlowTier

SLEEPING = ("fae", "hotline", "slipstream")


def test_the_tier_counts_the_sleep_it_injects():
    table = np.zeros((50, 4), np.float32)
    with SlowTier(table, row_cost_s=2e-6) as tier:
        tier.gather(np.arange(10))
        tier.update(np.arange(5), np.ones((5, 4), np.float32), 0.1)
        tier.barrier()
        # the requested sleep, row cost x rows (time.sleep overshoots such small requests: not the time slept)
        assert tier.injected_s == pytest.approx(15 * 2e-6)
    with SlowTier(table) as tier:
        tier.gather(np.arange(10))
        assert tier.injected_s == 0.0


@pytest.mark.parametrize("system", SLEEPING)
def test_the_regimes_slept_points_are_emulated(system):
    """The system's own regime variants swept at 0 and an added cost on a tiny workload, then its
    result's regime built as its result.py builds it: the point where the tier slept is emulated and
    says what it stands for; the contract refuses it relabelled measured."""
    mod = importlib.import_module(f"mlsys_flows.systems.{system}")
    p = mod.Params.for_scale("smoke", samples=1024, test_samples=256, batch_size=256, regime_samples=512,
                             regime_slow_row_us=[0.0, 2.0])
    ds = ex.dataset(p)
    hot, _ = ex.hot_rows(ds, p)
    sweep = ex.regime_sweep(ds, p, [ex.variant(n, p, hot) for n in mod.REGIME_VARIANTS])
    assert all(r["injected_sleep_s"] == 0 for r in sweep[0.0].values())
    # every variant moved slow-tier rows, so asked its tier for sleep (the request is counted, not the time slept)
    assert all(r["injected_sleep_s"] > 0 for r in sweep[2.0].values())
    metric = "samples_per_s" if system == "hotline" else "train_time_s"
    result = SystemResult(variants={})
    ex.add_regime(result, sweep, metric, p, mod.SPEC)
    assert [(s.value, s.kind) for s in result.regime] == [(0.0, "measured"), (2.0, "emulated")]
    assert not result.regime[0].emulated and "sleeps" in result.regime[1].emulated
    assert "sleeps" in result.assumptions["regime"]["slow_row_us"].source
    _check_emulated(mod.SPEC, result)
    result.regime[1].kind = "measured"
    with pytest.raises(ContractError, match="regime point.s. 2 took an injected cost"):
        _check_emulated(mod.SPEC, result)


def test_a_point_whose_tier_slept_is_emulated_whatever_its_value_says():
    """The label follows the runs' injected sleep, not only the parameter's value."""
    from mlsys_flows.systems.slipstream import Params

    p = Params.for_scale("smoke")
    run = {"train_time_s": 1.0, "test_logloss": 0.5, "slow_tier_share": 0.1, "injected_sleep_s": 0.0}
    sweep = {0.0: {"hybrid": dict(run), "slipstream": dict(run, injected_sleep_s=0.3)},
             1.0: {"hybrid": dict(run), "slipstream": dict(run)}}
    samples, _, _ = ex.regime_result(sweep, "train_time_s", p, "slipstream", ("hybrid",))
    assert [s.kind for s in samples] == ["emulated", "emulated"]
    sweep[0.0]["slipstream"]["injected_sleep_s"] = 0.0
    samples, _, _ = ex.regime_result(sweep, "train_time_s", p, "slipstream", ("hybrid",))
    assert [s.kind for s in samples] == ["measured", "emulated"]


def test_recshard_injects_no_sleep_and_its_regime_is_modelled():
    """RecShard's regime is a cost model over counted accesses (systems/recshard/result.py): no point
    sleeps, so none is emulated; were it to sleep, its points would need the emulated label."""
    import mlsys_flows.systems.recshard as rs

    src = pathlib.Path(rs.__file__).parent
    sleeping = [f.name for f in src.glob("*.py") if "sleep(" in f.read_text()]
    assert sleeping == [], f"recshard sleeps in {sleeping}: label those regime points emulated"
    assert "kind=\"modelled\"" in (src / "result.py").read_text()
