"""RecShard's mechanism ablation (greedy placement + hottest rows in HBM, no MILP) and the regime sweep
over the slow/fast per-access cost ratio: pure code."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recshard import (ABLATION, GREEDY, SPEC, Costs, Params, Plan, Profile, build_table,
                                          check_plan, cost_ratio_sweep, greedy, greedy_hot_rows, make_plans,
                                          plan_costs, profile_table, replay)


@pytest.fixture(scope="module")
def setup():
    p = Params.for_scale("smoke", num_tables=8, gpus=2, rows_max=20_000, batch=256, train_batches=4, eval_batches=3)
    spec = p.specs()
    tables = {j: build_table(spec, j, p.seed, p.hot_fraction, p.hot_share) for j in range(p.num_tables)}
    prof = Profile(spec.dim, p.batch * p.train_batches,
                   [profile_table(tables[j], j, p.batch * p.train_batches, p.seed) for j in tables])
    return p, tables, prof


def test_ablation_keeps_a_greedy_placement_and_fills_hbm_with_hot_rows(setup):
    p, _, prof = setup
    cap, model = p.capacity(prof), p.model_costs(prof.dim)
    key, plan = greedy_hot_rows(prof, p.gpus, cap, model, p.batch)
    check_plan(plan, prof, p.gpus, cap)
    whole = greedy(prof, p.gpus, cap, key)
    assert np.array_equal(plan.gpu, whole.gpu)                    # the greedy sharder's placement
    # hot rows, not whole tables (only profiled rows: untouched ones save nothing): cheaper on the profile
    assert plan_costs(plan, prof, model, p.batch, p.gpus).max() < plan_costs(whole, prof, model, p.batch, p.gpus).max()
    assert ((plan.hot_rows > 0) & (plan.hot_rows < prof.rows)).any()  # some tables split between the tiers


def test_cost_ratio_sweep_at_ratio_one_only_balance_counts(setup):
    p, tables, prof = setup
    plans, _, _ = make_plans(p, prof)
    assert ABLATION in plans
    counts = replay(tables, prof, plans, p.batch, p.eval_batches, p.seed)
    fast = np.full(prof.num_tables, 1e-9)
    out = cost_ratio_sweep(plans, counts, fast, [1.0, 10.0, 100.0], p.gpus, p.batch)
    assert list(out) == [1.0, 10.0, 100.0]
    for n, plan in plans.items():
        # at ratio 1 a plan's time is its slowest GPU's access count x the fast cost, whatever the tiers
        per_gpu = (counts[n][0] + counts[n][1]) @ np.eye(p.gpus)[plan.gpu]
        assert out[1.0][n] == pytest.approx(p.batch * p.eval_batches / (per_gpu.max(1).sum() * 1e-9))
        # a dearer slow tier never speeds a plan up
        assert out[1.0][n] >= out[10.0][n] >= out[100.0][n]
    # RecShard keeps the hot rows in HBM: its lead over the greedy sharders grows with the ratio
    lead = [at["recshard"] / max(at[g] for g in GREEDY) for at in out.values()]
    assert lead[-1] > lead[0]


def test_regime_parameters_and_spec():
    assert Params.for_scale("smoke").regime_cost_ratios == [1.0, 56.0]
    quick = Params.for_scale("quick").regime_cost_ratios
    assert len(quick) >= 4 and 56.0 in quick and min(quick) == 1.0
    with pytest.raises((ParamsError, ValueError), match="regime_cost_ratios"):
        Params.for_scale("smoke", regime_cost_ratios=[0.5, 2.0])
    assert SPEC.contract_v3 and SPEC.mechanism.ablation == ABLATION and SPEC.hardware
    assert not any("oracle" in SPEC.role(b) for b in SPEC.baselines)
    # contract v4: the headline times the worker's own tiers, not the paper's 56x: the spec says why
    assert SPEC.regime.paper_value == 56.0 and "56x" in SPEC.regime.operating_point_reason
    assert Costs(np.ones(2), np.ones(2)).uvm.shape == (2,) and isinstance(Plan(np.zeros(1, int), np.zeros(1, int)), Plan)
