"""The moetuner flow at smoke scale: a RunReport with a measured headline, all six variants, on storage."""
import math

from mlsys_flows.flows.moetuner import moetuner


def test_moetuner_flow_smoke(dask_cluster, local_storage):
    report = moetuner(scale="smoke", cluster=dask_cluster, storage=local_storage)
    h = report["headline"]
    assert h["metric"] == "end_to_end_time_s" and h["baseline"] == "contiguous" and h["technique"] == "moetuner"
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert set(report["variants"]) == {f"{v}{s}" for v in ("contiguous", "greedy", "moetuner") for s in ("", "_2node")}
    assert {r["baseline"] for r in report["ratios"]} >= {"contiguous_2node", "greedy", "greedy_2node"}
    assert 0.0 <= report["variants"]["moetuner_2node"]["ilp2_gap"] <= 1.0
    assert local_storage.exists(f"reports/moetuner/{report['run_id']}.json")
    assert local_storage.exists(f"runs/moetuner/{report['run_id']}/plans_2node.npz")
