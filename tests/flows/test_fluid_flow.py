"""The FLuID flow at smoke scale (the session's shared reference run): five policies (FedAvg dropping its
stragglers with a drop fraction tuned on a calibration seed among them) and FLuID with fixed stragglers, with a simulated time-to-accuracy headline, counted accuracies, client speeds that change
between rounds and stragglers re-detected from the previous round (the same for every re-detecting
policy), the injected faulty clients excluded from round 1 with their reasons while every round
completed, the 1-vs-all-workers fan-out, histories on storage."""
import json
import math

from faultkit import reference_run

POLICIES = ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout", "fluid", "fluid_static")


def test_fluid_flow_smoke(prefect_api):
    report, storage = reference_run("fluid")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("time_to_accuracy_s", "fedavg_wait", "fluid",
                                                                       "simulated")
    assert math.isfinite(h["ratio"]) and h["ratio"] > 0 and h["assumptions"]
    assert h["vs_strongest"]["baseline"] in ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout")
    v, kinds, params = report["variants"], report["metric_kinds"], report["parameters"]
    assert set(v) == {*POLICIES, "fanout_1_worker", "fanout_all_workers"}
    assert kinds["time_to_accuracy_s"] == kinds["mean_round_s"] == kinds["time_to_accuracy_raw_s"] == "simulated"
    assert kinds["final_accuracy"] == kinds["excluded_updates"] == kinds["accuracy_gap_pts"] == "counted"
    assert kinds["straggler_changes"] == kinds["rounds_off_profile"] == "counted"
    assert kinds["client_cpu_s"] == kinds["round_wall_s"] == "measured"
    assert {"final_accuracy", "rounds_to_target", "excluded_updates"} <= set(report["deterministic_metrics"])
    assert v["fedavg_wait"]["accuracy_gap_pts"] == 0.0
    for pol in POLICIES:
        m = v[pol]
        assert 0.0 < m["final_accuracy"] <= 1.0 and m["time_to_accuracy_s"] > 0 and m["mean_round_s"] > 0
        assert m["excluded_updates"] == params["faulty_clients"] == 3  # NaN, raised error, wrong shapes: round 1
        assert (m["straggler_kept_fraction"] == 1.0) == (pol in ("fedavg_wait", "fedavg_drop"))
        assert (m["dropped_updates"] > 0) == (pol == "fedavg_drop")
        # the smoke preset's busy spells move the straggler set; fluid_static keeps the profile's all run
        assert (m["straggler_changes"] == 0 and m["rounds_off_profile"] == 0) == (pol == "fluid_static")
    assert v["fanout_1_worker"]["round_wall_s"] > 0 and v["fanout_all_workers"]["round_wall_s"] > 0
    assert any("Excluded client updates" in n and "NaN/inf" in n and "RuntimeError" in n and "shape" in n
               for n in report["notes"])
    assert any(c["title"].startswith("Invariant Dropout threshold") for c in report["curves"])
    # every round completed (the faulty clients' round included) and the exclusions are on storage
    hist = json.loads(storage.read_bytes(f"runs/fluid/{report['run_id']}/history_fluid_seed{params['seed']}.json"))
    assert len(hist["accuracy"]) == len(hist["round_s"]) == len(hist["round_raw_s"]) == params["rounds"]
    assert all(0 <= a <= 1 for a in hist["accuracy"]) and all(x > 0 for x in hist["round_s"])
    assert [c for c, _ in hist["excluded"][1]] == [0, 1, 2] and all(not e for i, e in enumerate(hist["excluded"]) if i != 1)
    assert hist["profile_stragglers"] and all(r < 1.0 for r in hist["profile_r"])
    assert hist["slowed"] == hist["profile_stragglers"]
    assert len(hist["stragglers"]) == len(hist["r"]) == len(hist["speed"]) == params["rounds"]
    assert hist["stragglers"][1] == hist["profile_stragglers"]  # round 1 is planned from round 0: the profile
    assert len({tuple(s) for s in hist["stragglers"][1:]}) > 1 and all(0.5 <= r <= 1 for rs in hist["r"] for r in rs)
    assert any(row != hist["speed"][0] for row in hist["speed"][1:])  # speeds changed between rounds
    others = {pol: json.loads(storage.read_bytes(f"runs/fluid/{report['run_id']}/history_{pol}_seed{params['seed']}.json"))
              for pol in POLICIES if pol != "fluid"}
    for pol in ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout"):  # the same speeds, stragglers, sizes
        assert (others[pol]["speed"], others[pol]["stragglers"], others[pol]["r"]) == (hist["speed"], hist["stragglers"],
                                                                                   hist["r"])
    assert others["fluid_static"]["speed"] == hist["speed"]
    assert all(s == hist["profile_stragglers"] for s in others["fluid_static"]["stragglers"])
    # contract v3: random dropout (same stragglers and sizes, neurons by chance) is the mechanism's ablation;
    # the regime re-runs the federation at each straggler slowdown
    mech = h["mechanism"]
    assert mech["baseline"] == "random_dropout" and mech["technique"] == "fluid" and mech["ratio"] > 0
    assert report["roles"]["fedavg_wait"] == ["paper", "deployable"] and "fluid_static" not in report["roles"]
    redetect = {(r["metric"], r["baseline"]) for r in report["ratios"] if r["baseline"] == "fluid_static"}
    assert redetect == {("time_to_accuracy_s", "fluid_static"), ("mean_round_s", "fluid_static"),
                        ("final_accuracy", "fluid_static")}
    assert all(r["kind"] == "simulated" and r["assumptions"] for r in report["ratios"]
               if r["baseline"] == "fluid_static" and r["metric"] != "final_accuracy")
    assert any("Straggler re-detection" in n for n in report["notes"])
    # fedavg_drop: tuned on the calibration seed (never an evaluated one), then run with that fraction
    drop = others["fedavg_drop"]["drop_fraction"]
    assert drop in params["drop_fractions"]  # round 1's faulty clients leave fewer valid updates than it waits for
    assert all(len(d) > 0 for i, d in enumerate(others["fedavg_drop"]["dropped"]) if i != 1)
    cal = params["seed"] + 1000
    for d in params["drop_fractions"]:
        run = json.loads(storage.read_bytes(f"runs/fluid/{report['run_id']}/calibration_fedavg_drop{d:g}_seed{cal}.json"))
        assert run["drop_fraction"] == d and run["stop_at"] > 0
    assert any("fedavg_drop" in n and "calibration seed" in n for n in report["notes"])
    reg = report["regime"]
    assert reg["parameter"] == "straggler_slowdown" and [pt["value"] for pt in reg["points"]] == [1.5, 3.0]
    # the point at 3 re-ran the federation there (sub-models sized to it), stopping at the target
    rerun = json.loads(storage.read_bytes(f"runs/fluid/{report['run_id']}/regime_x3_fluid_seed{params['seed']}.json"))
    assert rerun["straggler_slowdown"] == 3 and rerun["slowed"] == hist["slowed"]
    assert rerun["stop_at"] > 0 and len(rerun["accuracy"]) <= params["rounds"]
    assert sum(rerun["profile_r"]) < sum(hist["profile_r"])
    assert reg["headline_value"] == params["straggler_slowdown"] == 1.5
    assert all(pt["kind"] == "simulated" and pt["repeats"] == 1 for pt in reg["points"])
    assert reg["wins"] in ("above", "below", "everywhere", "nowhere", "undecided")  # smoke: one sample a point
