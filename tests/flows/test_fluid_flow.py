"""The FLuID flow at smoke scale (the session's shared reference run): four policies with a simulated
time-to-accuracy headline, counted accuracies, the injected faulty clients excluded from round 1 with
their reasons while every round completed, the 1-vs-all-workers fan-out, histories on storage."""
import json
import math

from faultkit import reference_run

POLICIES = ("fedavg_wait", "random_dropout", "ordered_dropout", "fluid")


def test_fluid_flow_smoke(prefect_api):
    report, storage = reference_run("fluid")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("time_to_accuracy_s", "fedavg_wait", "fluid",
                                                                       "simulated")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0 and h["assumptions"]
    assert h["vs_strongest"]["baseline"] in ("fedavg_wait", "random_dropout", "ordered_dropout")
    v, kinds, params = report["variants"], report["metric_kinds"], report["parameters"]
    assert set(v) == {*POLICIES, "fanout_1_worker", "fanout_all_workers"}
    assert kinds["time_to_accuracy_s"] == kinds["mean_round_s"] == kinds["time_to_accuracy_raw_s"] == "simulated"
    assert kinds["final_accuracy"] == kinds["excluded_updates"] == kinds["accuracy_gap_pts"] == "counted"
    assert kinds["client_cpu_s"] == kinds["round_wall_s"] == "measured"
    assert {"final_accuracy", "rounds_to_target", "excluded_updates"} <= set(report["deterministic_metrics"])
    assert v["fedavg_wait"]["accuracy_gap_pts"] == 0.0
    for pol in POLICIES:
        m = v[pol]
        assert 0.0 < m["final_accuracy"] <= 1.0 and m["time_to_accuracy_s"] > 0 and m["mean_round_s"] > 0
        assert m["excluded_updates"] == params["faulty_clients"] == 3  # NaN, raised error, wrong shapes: round 1
        assert (m["straggler_kept_fraction"] == 1.0) == (pol == "fedavg_wait")
    assert v["fanout_1_worker"]["round_wall_s"] > 0 and v["fanout_all_workers"]["round_wall_s"] > 0
    assert any("Excluded client updates" in n and "NaN/inf" in n and "RuntimeError" in n and "shape" in n
               for n in report["notes"])
    assert any(c["title"].startswith("Invariant Dropout threshold") for c in report["curves"])
    # every round completed (the faulty clients' round included) and the exclusions are on storage
    hist = json.loads(storage.read_bytes(f"runs/fluid/{report['run_id']}/history_fluid_seed{params['seed']}.json"))
    assert len(hist["accuracy"]) == len(hist["round_s"]) == len(hist["round_raw_s"]) == params["rounds"]
    assert all(0 <= a <= 1 for a in hist["accuracy"]) and all(x > 0 for x in hist["round_s"])
    assert [c for c, _ in hist["excluded"][1]] == [0, 1, 2] and all(not e for i, e in enumerate(hist["excluded"]) if i != 1)
    assert hist["stragglers"] and all(r < 1.0 for r in hist["r"])
    # contract v3: random dropout (same stragglers and sizes, neurons by chance) is the mechanism's ablation;
    # the regime re-times the runs at each straggler slowdown, the headline's among them
    mech = h["mechanism"]
    assert mech["baseline"] == "random_dropout" and mech["technique"] == "fluid" and mech["ratio"] > 0
    assert report["roles"]["fedavg_wait"] == ["paper", "deployable"]
    reg = report["regime"]
    assert reg["parameter"] == "straggler_slowdown" and [pt["value"] for pt in reg["points"]] == [1.0, 3.0]
    assert reg["headline_value"] == params["straggler_slowdown"] == 1.5
    assert all(pt["kind"] == "simulated" and pt["repeats"] == 1 for pt in reg["points"])
    assert reg["wins"] in ("above", "below", "everywhere", "nowhere")
