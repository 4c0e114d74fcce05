"""The moetuner flow at smoke scale: a RunReport with a modelled headline, all ten variants, on storage."""
import io
import math

import numpy as np
import pytest
from faultkit import reference_run


def test_moetuner_flow_smoke():
    """The shared smoke run (faultkit.reference_run), as the contract test sees it."""
    report, storage = reference_run("moetuner")
    h = report["headline"]
    assert h["metric"] == "end_to_end_time_s" and h["baseline"] == "contiguous" and h["technique"] == "moetuner"
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    kinds = report["metric_kinds"]  # times from the serving model, solver objectives exact, solve times wall clock
    assert h["kind"] == kinds["end_to_end_time_s"] == kinds["communication_s"] == "modelled"
    assert kinds["ilp2_objective"] == kinds["ilp2_gap"] == "counted" and kinds["ilp2_solve_s"] == "measured"
    assert set(report["variants"]) == {f"{v}{s}" for v in ("contiguous", "greedy", "moetuner_ilp1", "moetuner_rank_aligned", "moetuner") for s in ("", "_2node")} | {"contiguous_kernel", "moetuner_kernel", "kernel"}
    # contract v3: the measured expert kernel prices the *_kernel variants; the mechanism is ILP 2, its ablation
    # ILP 1's clusters labelled by smallest expert id (a different plan); the regime is the two-node setup at each
    # intra/inter bandwidth ratio
    v = report["variants"]
    assert kinds["expert_us_per_token"] == "measured" and v["kernel"]["expert_us_per_token"] > 0
    assert "expert_us_per_token_measured" in report["assumptions"]["end_to_end_time_s"]
    assert v["contiguous_kernel"]["moe_compute_s"] > v["contiguous"]["moe_compute_s"]
    mech = h["mechanism"]
    assert mech["baseline"] == "moetuner_ilp1" and math.isfinite(mech["ratio"]) and mech["ratio"] > 0
    plans = np.load(io.BytesIO(storage.read_bytes(f"runs/moetuner/{report['run_id']}/plans_1node.npz")))
    assert not np.array_equal(plans["moetuner_ilp1"], plans["moetuner"])
    reg = report["regime"]
    assert reg["parameter"] == "inter_node_bandwidth_ratio" and [pt["value"] for pt in reg["points"]] == [1.0, 16.0]
    assert all(pt["kind"] == "modelled" and pt["baseline"] in ("contiguous", "greedy") for pt in reg["points"])
    # the regime's point at the run's own ratio (100 / 6.25) is the two-node result
    two = min(v["contiguous_2node"]["end_to_end_time_s"], v["greedy_2node"]["end_to_end_time_s"])
    assert reg["points"][1]["ratio"] == two / v["moetuner_2node"]["end_to_end_time_s"]
    assert {r["baseline"] for r in report["ratios"]} >= {"contiguous_2node", "greedy", "greedy_2node", "moetuner_ilp1", "moetuner_ilp1_2node", "moetuner_rank_aligned", "moetuner_rank_aligned_2node"}
    assert 0.0 <= report["variants"]["moetuner_2node"]["ilp2_gap"] <= 1.0
    assert storage.exists(f"reports/moetuner/{report['run_id']}.json")
    assert storage.exists(f"runs/moetuner/{report['run_id']}/plans_2node.npz")


def test_moetuner_flow_pairs_one_node_repeats():
    """With repeats, every one-node variant's sampled metrics hold one value per paired repeat (each repeat on
    its own trace and split, seed + r), the first of them the run's own one-node result; the two-node setup
    stays one sample. On main the flow ran no repeats: the samples held the kernel timings only."""
    report, _ = reference_run("moetuner", {"repeats": 2})
    s = report["samples"]
    for v in ("contiguous", "greedy", "moetuner_ilp1", "moetuner_rank_aligned", "moetuner"):
        assert len(s[v]["end_to_end_time_s"]) == 2 and len(s[v]["token_p99_latency_s"]) == 2
        assert report["variants"][v]["end_to_end_time_s"] == pytest.approx(sum(s[v]["end_to_end_time_s"]) / 2)
    assert s["contiguous"]["end_to_end_time_s"][0] != s["contiguous"]["end_to_end_time_s"][1]  # another trace
    assert "moetuner_2node" not in s
