"""The metropolis flow at smoke scale (the session's shared reference run): three policies, the same
final world in every run, measured makespans with their repeats, simulated ones, the true clusters
saved on storage for the oracle."""
import json

from faultkit import reference_run

from mlsys_flows.systems.metropolis import Params, simulate


def test_metropolis_flow_smoke():
    report, storage = reference_run("metropolis")
    v, kinds = report["variants"], report["metric_kinds"]
    assert set(v) == {"global_sync", "out_of_order", "oracle"}
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("makespan_s", "global_sync", "out_of_order", "measured")
    assert kinds["sim_makespan_s"] == "simulated" and kinds["llm_calls"] == kinds["state_matches_global"] == "counted"
    assert {"latency_median_s", "latency_sigma", "llm_slots"} <= set(report["assumptions"]["sim_makespan_s"])
    # the equivalence: every run (simulated and real threads) ended in global sync's world
    assert all(m["state_matches_global"] == 1.0 for m in v.values())
    for metric in ("llm_calls", "cluster_steps", "conversations"):
        assert len({m[metric] for m in v.values()}) == 1
    # the simulated clock is the pure engine's, exactly
    p = Params.for_scale("smoke")
    g = simulate("global_sync", p.config(), p.llm_slots)
    assert v["global_sync"]["sim_makespan_s"] == g.makespan_s and v["global_sync"]["llm_calls"] == g.llm_calls
    assert v["oracle"]["sim_makespan_s"] <= v["out_of_order"]["sim_makespan_s"] <= v["global_sync"]["sim_makespan_s"]
    assert v["out_of_order"]["sim_max_clock_spread"] > 0 == v["global_sync"]["sim_max_clock_spread"]
    # wall clock: each makespan sampled once per repeat, and never shorter than the longest call chain allows
    for name in v:
        xs = report["samples"][name]["makespan_s"]
        assert len(xs) == p.repeats and min(xs) > 0
        assert v[name]["makespan_s"] >= 0.5 * v[name]["sim_makespan_s"]
    assert "prefect_task_overhead_s" not in report["samples"]["out_of_order"]  # its own probe, not a repeat
    assert v["out_of_order"]["prefect_task_overhead_s"] > 0
    truth = json.loads(storage.read_bytes(f"runs/metropolis/{report['run_id']}/true_clusters-0.json"))
    assert len(truth) == v["global_sync"]["cluster_steps"]
    assert {r["baseline"] for r in report["ratios"]} >= {"oracle", "global_sync"}
    # contract v3: the oracle is labelled so and stands beside the headline; the ablation is the barrier
    assert report["roles"] == {"global_sync": ["paper", "deployable"], "oracle": ["oracle"]}
    assert h["vs_oracle"]["baseline"] == "oracle" and h["vs_strongest"]["baseline"] == "global_sync"
    assert h["mechanism"]["baseline"] == "global_sync" and h["mechanism"]["ratio"] == h["ratio"]
    reg = report["regime"]
    assert reg["parameter"] == "radius" and [pt["value"] for pt in reg["points"]] == [1.0, 6.0]
    assert reg["headline_value"] == p.radius and all(pt["kind"] == "simulated" for pt in reg["points"])
    # the out-of-order rule never loses to the barrier on the simulated clock; a wider radius blocks more
    ratios = [pt["ratio"] for pt in reg["points"]]
    assert all(r >= 1.0 for r in ratios) and ratios[0] > ratios[1]
