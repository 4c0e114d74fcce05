"""FlexShard's mechanism ablation (the planner without its per-node tier) and the regime sweep over
batch x sequence / rows: pure code."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.flexshard import (ABLATION, FULL, NODE, REGIME_VARIANTS, SPEC, VARIANTS, Params,
                                           access_estimates, flexshard, make_plans, regime_point)
from mlsys_flows.systems.flexshard.result import regime_sample


def test_the_ablation_is_flexshard_without_the_node_tier_in_the_same_memory():
    p = Params.for_scale("smoke")
    w = p.make_workload()
    plans = make_plans(p, w)
    topo = p.topology()
    flat, fs = plans[ABLATION], plans["flexshard"]
    assert VARIANTS[ABLATION] == (ABLATION, False)
    assert (flat.tier == NODE).sum() == 0 and (fs.tier == NODE).sum() > 0 and (flat.tier == FULL).sum() > 0
    assert flat.rows_per_device(topo).max() <= flat.capacity_rows == fs.capacity_rows
    # the same planner: with the node tier allowed (tiered=True) it is FlexShard's plan exactly
    lam, _, u = access_estimates(w.train_counts, w.offsets, w.train_iterations, w.devices)
    again = flexshard(lam, u, w.offsets, topo, p.memory_headroom, tiered=True)
    assert np.array_equal(again.tier, fs.tier) and np.array_equal(again.owner, fs.owner)


def test_regime_point_sets_batch_seq_over_rows_and_equal_memory():
    p = Params.for_scale("smoke")
    for x in p.regime_lookups_per_row:
        out = regime_point(p, x)
        assert set(out) == set(REGIME_VARIANTS)
        assert out["rowwise"]["lookups"] == out["flexshard"]["lookups"] > 0
        # the per-lookup row-wise baseline fetches about (D-1)/D of the lookups whatever the row count
        assert out["rowwise"]["fetched_per_lookup"] == pytest.approx((p.devices - 1) / p.devices, abs=0.02)
        assert out["rowwise_cache"]["memory_vs_rowwise"] == pytest.approx(out["flexshard"]["memory_vs_rowwise"], abs=0.01)
        assert out["rowwise_dedup"]["alltoall_bytes"] <= out["rowwise"]["alltoall_bytes"]
        assert regime_sample(p, x, out).valid  # equal memory by construction
    lo, hi = (regime_point(p, x) for x in p.regime_lookups_per_row)
    # more lookups per row: a deduplicating all-to-all collapses more repeats
    assert hi["rowwise_dedup"]["alltoall_bytes"] < 0.5 * lo["rowwise_dedup"]["alltoall_bytes"]


def test_regime_parameters_and_spec():
    quick = Params.for_scale("quick")
    assert len(quick.regime_lookups_per_row) >= 4
    assert min(quick.regime_lookups_per_row) <= 0.033 <= quick.lookups_per_row() * 1.01 and \
        max(quick.regime_lookups_per_row) >= 3
    assert quick.regime_rows(1.0) == quick.batch_per_device * quick.seq_len
    assert len(Params.for_scale("smoke").regime_lookups_per_row) == 2
    with pytest.raises((ParamsError, ValueError), match="regime_lookups_per_row"):
        Params.for_scale("smoke", regime_lookups_per_row=[0.03, 100.0])  # 41 rows: too few
    assert SPEC.contract_v3 and SPEC.mechanism.ablation == ABLATION
    assert not any("oracle" in SPEC.role(b) for b in SPEC.baselines)


def test_a_regime_point_off_equal_memory_is_invalid():
    p = Params.for_scale("smoke")
    at = {v: {"alltoall_inter_bytes": 1.0, "memory_vs_rowwise": 1.0} for v in REGIME_VARIANTS}
    at["flexshard"]["memory_vs_rowwise"] = 1.04
    assert regime_sample(p, 1.0, at).valid
    at["rowwise_cache"]["memory_vs_rowwise"] = 1.05
    point = regime_sample(p, 1.0, at)
    assert not point.valid and "rowwise_cache holds 1.0500x" in point.invalid and point.kind == "counted"
    at["rowwise_cache"]["memory_vs_rowwise"], at["flexshard"]["memory_vs_rowwise"] = 1.0, 1 + p.memory_headroom + 0.01
    assert "above its budget" in regime_sample(p, 1.0, at).invalid


def test_the_regime_carries_the_dedup_setting_at_its_own_equal_memory():
    """Issue 45 review: the regime compares dedup against dedup too (flexshard_dedup vs rowwise_dedup and the
    equal-memory rowwise_dedup_cache), beside the headline's per-lookup comparison."""
    from mlsys_flows.systems.flexshard import REGIME_DEDUP_PAIRS
    from mlsys_flows.systems.flexshard.result import dedup_pair_memory

    assert {"flexshard_dedup", "rowwise_dedup_cache"} <= set(REGIME_VARIANTS)
    assert ("rowwise_dedup", "flexshard_dedup") in REGIME_DEDUP_PAIRS
    p = Params.for_scale("smoke")
    out = regime_point(p, p.regime_lookups_per_row[-1])
    assert out["rowwise_dedup_cache"]["memory_vs_rowwise"] == pytest.approx(out["flexshard_dedup"]["memory_vs_rowwise"],
                                                                            abs=0.01)
    assert dedup_pair_memory(out) == ""
    # deduplicated fetches never exceed the per-lookup ones of the same plan family
    assert out["flexshard_dedup"]["alltoall_bytes"] <= out["flexshard"]["alltoall_bytes"]
    broken = {**out, "rowwise_dedup_cache": {**out["rowwise_dedup_cache"],
                                             "memory_vs_rowwise": out["flexshard_dedup"]["memory_vs_rowwise"] + 0.1}}
    assert "above flexshard_dedup's" in dedup_pair_memory(broken)
    # the headline's point stays valid whatever the dedup pair holds: it compares flexshard with the per-lookup baselines
    assert regime_sample(p, 3.0, broken).valid


def test_the_headline_bytes_carry_the_link_bandwidths_and_all_inter_node_traffic_stands_beside_it():
    """Issue 45 review: counted bytes come from plans optimised for the assumed bandwidths (an assumption of the
    headline), and all inter-node traffic with the replicas' sync and the modelled latency stand beside it."""
    from mlsys_flows.systems.flexshard.result import link_assumptions

    p = Params.for_scale("quick")
    a = link_assumptions(p)
    assert a["intra_node_gb_s"].value == p.intra_node_gb_s and a["inter_node_gb_s"].value == p.inter_node_gb_s
    assert a["bandwidth_ratio"].value == pytest.approx(12.0) and "tier_costs" in a["bandwidth_ratio"].source
    beside = [(c.metric, c.baseline) for c in SPEC.claims[1:3]]
    assert beside == [("modeled_comm_latency_s", "rowwise_cache"), ("comm_inter_node_bytes", "rowwise_cache")]
    assert "gradient sync" in SPEC.claims[2].statement
