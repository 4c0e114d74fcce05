"""The moetuner flow at smoke scale: a RunReport with a modelled headline, all eight variants, on storage."""
import math

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
    assert set(report["variants"]) == {f"{v}{s}" for v in ("contiguous", "greedy", "moetuner_ilp1", "moetuner") for s in ("", "_2node")}
    assert {r["baseline"] for r in report["ratios"]} >= {"contiguous_2node", "greedy", "greedy_2node", "moetuner_ilp1", "moetuner_ilp1_2node"}
    assert 0.0 <= report["variants"]["moetuner_2node"]["ilp2_gap"] <= 1.0
    assert storage.exists(f"reports/moetuner/{report['run_id']}.json")
    assert storage.exists(f"runs/moetuner/{report['run_id']}/plans_2node.npz")
