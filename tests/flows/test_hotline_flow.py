"""The hotline flow at smoke (the session's shared reference run): variants, kinds, the enforced
accuracy parity and the system's own counters."""
import math

from faultkit import reference_run


def test_hotline_smoke_report(prefect_api):
    report, storage = reference_run("hotline")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"]) == ("samples_per_s", "hybrid", "hotline")
    assert h["kind"] == "measured" and math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert h["vs_strongest"] is not None
    v, kinds = report["variants"], report["metric_kinds"]
    assert {"hybrid", "fae", "hotline", "hotline_sync"} <= set(v)
    assert kinds["time_to_logloss_s"] == kinds["samples_per_s"] == kinds["train_time_s"] == "measured"
    assert kinds["test_logloss"] == kinds["logloss_gap"] == kinds["hot_input_fraction"] == "counted"
    gap = report["parameters"]["parity_gap"]
    assert all(v[n]["logloss_gap"] <= gap for n in {"hybrid", "fae", "hotline"})  # the parity the run enforces
    assert all(0 < v[n]["test_auc"] <= 1 for n in {"hybrid", "fae", "hotline"})
    assert 0 < v["hotline"]["hot_input_fraction"] < 1
    assert len(report["samples"]["hybrid"]["time_to_logloss_s"]) == report["parameters"]["repeats"]
    assert kinds["gather_overlap"] == "measured" and 0 <= v["hotline"]["gather_overlap"] <= 1
    assert v["hotline"]["rows_gathered"] < v["hybrid"]["rows_gathered"]
    assert abs(v["hotline"]["test_logloss"] - v["hybrid"]["test_logloss"]) < 1e-3  # the same update, float rounding
    assert {(r["metric"], r["baseline"]) for r in report["ratios"]} >= {("samples_per_s", "fae")}
    # the mechanism's ablation: the same pipeline with the gather inline (same rows, same update)
    m = h["mechanism"]
    assert m["baseline"] == "hotline_sync" and m["kind"] == "measured" and math.isfinite(m["ratio"]) and m["ratio"] > 0
    assert v["hotline_sync"]["rows_gathered"] == v["hotline"]["rows_gathered"]
    assert abs(v["hotline_sync"]["test_logloss"] - v["hotline"]["test_logloss"]) < 1e-3
    assert "gather_overlap" not in report["samples"]["hotline_sync"]  # nothing gathered in the background
    # the regime: the slow tier slowed per row at the smoke preset's points
    r = report["regime"]
    assert r["parameter"] == "slow_row_us" and [pt["value"] for pt in r["points"]] == [0.0, 10.0]
    assert all(pt["ratio"] > 0 for pt in r["points"]) and r["headline_value"] == 0.0
    # the tier sleeps at an added cost: that point is emulated, and says what it stands for
    assert [pt["kind"] for pt in r["points"]] == ["measured", "emulated"]
    assert "sleeps" in report["assumptions"]["regime"]["slow_row_us"]["source"]
    assert all(pt["valid"] or "parity gap" in pt["invalid"] for pt in r["points"])
    pr = report["projection"]
    assert pr["kind"] == "modelled" and pr["ratio"] > 0 and {"pcie_gb_s", "host_row_us"} <= set(pr["assumptions"])
    assert storage.exists(f"reports/hotline/{report['run_id']}.json")
