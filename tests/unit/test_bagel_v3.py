"""BAGEL, contract v3: the exploitation-only ablation runs with the same budget; the share of relevant
passages outside the retriever's top-B grows with the relevant passages per cluster; trials draw
different queries; the regime's values are validated."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.bagel import Params, dense_rank, evaluate_queries, outside_top_b
from mlsys_flows.systems.common.params import ParamsError


def test_outside_top_b_counts_what_reranking_cannot_reach():
    p = Params.for_scale("smoke")
    data = p.workload(0, per_cluster=5, queries=3)
    X, q = data["X"], data["queries"][0]
    order = dense_rank(X, q.q)
    assert outside_top_b(X, q, len(X)) == 0.0
    inside = np.isin(q.relevant, order[:10]).mean()
    assert outside_top_b(X, q, 10) == pytest.approx(1 - inside)
    # the far cluster lies outside a small top-B, so at least its share is out of reach
    assert outside_top_b(X, q, 10) >= len(np.setdiff1d(q.relevant, q.near)) / len(q.relevant) - 1e-9


def test_more_relevant_passages_lie_outside_the_top_b():
    p = Params.for_scale("smoke")
    share = {c: np.mean([outside_top_b(d["X"], q, p.budget) for q in d["queries"]])
             for c in (5, 20) for d in [p.workload(0, per_cluster=c, queries=4)]}
    assert share[20] > share[5]


def test_exploit_ablation_runs_at_equal_budget():
    p = Params.for_scale("smoke")
    data = p.workload(0, queries=2)
    res = evaluate_queries(data["X"], data["queries"], [p.budget], p.config(), p.score_noise, exploit=True)
    assert set(res["recall"]) == {"dense", "rerank", "bagel", "bagel_exploit"}
    assert res["calls"]["bagel_exploit"][p.budget] == [p.budget, p.budget]
    assert len(res["outside_top_b"][p.budget]) == 2


def test_trials_draw_different_queries():
    p = Params.for_scale("smoke")
    a, b = p.workload(0), p.workload(1)
    assert not np.allclose(a["queries"][0].q, b["queries"][0].q)


@pytest.mark.parametrize("bad", [dict(regime_per_cluster=[5]), dict(regime_per_cluster=[5, 5]),
                                 dict(regime_per_cluster=[0, 5]), dict(trials=0)])
def test_bad_regime_parameters_are_rejected(bad):
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", **bad)
