"""The fae flow at smoke (the session's shared reference run): variants, kinds, the enforced
accuracy parity and the system's own counters."""
import math

from faultkit import reference_run


def test_fae_smoke_report(prefect_api):
    report, storage = reference_run("fae")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"]) == ("time_to_logloss_s", "hybrid", "fae")
    assert h["kind"] == "measured" and math.isfinite(h["ratio"]) and h["ratio"] > 0
    assert h["vs_strongest"] is not None
    v, kinds = report["variants"], report["metric_kinds"]
    assert {"hybrid", "fae", "cache"} <= set(v)
    assert kinds["time_to_logloss_s"] == kinds["samples_per_s"] == kinds["train_time_s"] == "measured"
    assert kinds["test_logloss"] == kinds["logloss_gap"] == kinds["hot_input_fraction"] == "counted"
    gap = report["parameters"]["parity_gap"]
    assert all(v[n]["logloss_gap"] <= gap for n in {"hybrid", "fae", "cache"})  # the parity the run enforces
    assert all(0 < v[n]["test_auc"] <= 1 for n in {"hybrid", "fae"})
    assert 0 < v["fae"]["hot_input_fraction"] < 1
    assert len(report["samples"]["hybrid"]["time_to_logloss_s"]) == report["parameters"]["repeats"]
    sweep = [v for v in report["variants"] if v.startswith("fae@")]
    assert sweep and all(0 <= report["variants"][s]["hot_input_fraction"] <= 1 for s in sweep)
    # hot batches gather nothing: fewer batch rows from the slow tier, the syncs' rows counted apart
    assert v["fae"]["syncs"] >= 2 and v["fae"]["sync_rows"] == v["fae"]["syncs"] * v["fae"]["hot_rows"]
    assert v["fae"]["rows_gathered"] < v["hybrid"]["rows_gathered"]
    assert any(c["title"].startswith("FAE budget sweep") for c in report["curves"])
    # the mechanism's ablation: FAE's hot rows as a cache, no input classification, no syncs
    m = h["mechanism"]
    assert m["baseline"] == "cache" and m["kind"] == "measured" and math.isfinite(m["ratio"]) and m["ratio"] > 0
    assert v["cache"]["syncs"] == 0 and v["cache"]["hot_rows"] == v["fae"]["hot_rows"]
    assert v["cache"]["rows_gathered"] <= v["fae"]["rows_gathered"]  # every hot row stays in the fast tier
    assert abs(v["cache"]["test_logloss"] - v["hybrid"]["test_logloss"]) < 1e-3  # the same update as hybrid
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
    assert storage.exists(f"reports/fae/{report['run_id']}.json")
