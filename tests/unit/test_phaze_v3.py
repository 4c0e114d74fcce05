"""PHAZE's contract-v3 parts: the capacity regime re-places every design on the same layer costs, the
co-search's pick is never below the single-chip-first one, and the spec's roles."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.phaze import SPEC, Params, evaluate_all_sizes, regime_pick


@pytest.fixture(scope="module")
def smoke_results():
    p = Params.for_scale("smoke", regime_gib_per_stack=[0.003, 1.0, 8.0])
    return p, {a.name: evaluate_all_sizes(p, a) for a in p.designs()}


def test_regime_at_the_headline_capacity_is_the_headline_placement(smoke_results):
    p, res = smoke_results
    for r in res.values():
        small = r[""]
        assert small["regime_throughput"][p.hbm_gib_per_stack] == pytest.approx(small["train_throughput"], rel=1e-12)
        caps = sorted(small["regime_throughput"])
        tps = [small["regime_throughput"][g] for g in caps]
        assert tps == sorted(tps)  # more memory never hurts the best placement
        assert "regime_throughput" in r["_large"] and not r["_large"]["regime_throughput"]  # the headline model only


def test_regime_pick(smoke_results):
    p, res = smoke_results
    sweep = regime_pick(res)
    assert list(sweep) == [0.003, 1.0, 8.0]
    for g, tp in sweep.items():
        assert tp["phaze"] == max(r[""]["regime_throughput"][g] for r in res.values())
        assert tp["phaze"] >= tp["chip_first_topk"] >= tp["single_chip_first"] and tp["phaze"] >= tp["tpuv4_like"]
    assert all(tp["chip_first_topk"] == tp["single_chip_first"] for tp in regime_pick(res, 1).values())
    assert sweep[0.003]["phaze"] < sweep[8.0]["phaze"]  # a few MiB per stack binds


def test_spec_is_v3():
    assert SPEC.contract_v3 and SPEC.mechanism.ablation == "single_chip_first"
    # the paper's two-step ablation is no deployable rival; the practitioner's top-k chip-first is
    assert "deployable" not in SPEC.roles["single_chip_first"] and "deployable" in SPEC.roles["chip_first_topk"]
    assert SPEC.regime.paper_value == Params().hbm_gib_per_stack
    with pytest.raises(Exception, match="regime_gib_per_stack"):
        Params.for_scale("smoke", regime_gib_per_stack=[1.0, 1.0])


def test_a_regime_point_where_nothing_fits_in_memory_is_invalid():
    from mlsys_flows.systems.phaze.result import _memory_validity

    assert _memory_validity(8.0, {"phaze": 2.0, "single_chip_first": 0.0, "tpuv4_like": 1.0}) == {}
    out = _memory_validity(0.5, {"phaze": 0.0, "single_chip_first": 0.0, "tpuv4_like": 0.0})
    assert out["valid"] is False and "phaze" in out["invalid"]
