"""The vcache flow at smoke scale (the session's shared reference run): counted hit and error rates for
vCache at three error bounds against a static threshold calibrated on a held-out stream (deployable),
the hindsight best static threshold (oracle), the global-threshold ablation and the class-confusion
regime, over three seeds; MiniLM paraphrases against hindsight thresholds."""
import math

from faultkit import reference_run


def test_vcache_flow_smoke(prefect_api):
    report, storage = reference_run("vcache")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("hit_rate", "static_threshold", "vcache", "counted")
    assert math.isfinite(h["ratio"]) or h["ratio"] == math.inf
    v, kinds = report["variants"], report["metric_kinds"]
    assert kinds["hit_rate"] == kinds["error_rate"] == "counted"
    for lvl, d in (("_low", 0.01), ("", 0.02), ("_high", 0.05)):
        assert v[f"static_oracle{lvl}"]["error_rate"] <= d + 1e-12          # chosen in hindsight to meet delta
        assert v[f"static_threshold{lvl}"]["delta"] == v[f"vcache{lvl}"]["delta"] == d
    for lvl, d in (("_low", 0.01), ("", 0.02), ("_high", 0.05)):
        static, vc = v[f"static_oracle{lvl}_minilm"], v[f"vcache{lvl}_minilm"]
        assert static["error_rate"] <= d + 1e-12
        assert 0.0 <= vc["hit_rate"] <= 1.0 and 0.0 <= vc["error_rate"] <= vc["hit_rate"]
    # the oracle is labelled so and beside the headline, never its denominator
    assert report["roles"] == {"static_threshold": ["deployable"], "static_oracle": ["oracle"]}
    assert h["vs_oracle"]["baseline"] == "static_oracle"
    # three seeds: every headline variant has one sample per seed, every seed (the harness, not the result, drops
    # the seeds where a side broke delta: issue 47's review, M4), the pairs aligned; the report's constraint counts
    # the seeds where both vCache and the calibrated static threshold met delta, and the notes say who broke it
    s = report["samples"]
    n = len(s.get("vcache", {}).get("hit_rate", []))
    assert n == 3 and all(len(s.get(x, {}).get("hit_rate", [])) == n
                          for x in ("vcache", "static_threshold", "static_oracle", "vcache_global", "static_same_hits"))
    assert any(x.startswith(("The headline compares at equal constraint", "On no seed")) for x in report["notes"])
    assert any(x.startswith("Error budget used") for x in report["notes"])
    c = report["constraint"]
    both = sum(ve <= 0.02 and se <= 0.02 for ve, se in zip(s["vcache"]["error_rate"], s["static_threshold"]["error_rate"]))
    assert c["bound"] == 0.02 and c["pairs"] == n and c["pairs_standing"] == both
    assert h["vs_strongest"]["verdict"]["outcome"] == "ties"  # at most 3 pairs: fewer than 6
    assert h["repeats"] == c["pairs_counted"] or c["pairs_counted"] == 0
    # the equal-error baseline meets vCache's realized error on every seed
    assert all(e <= t + 1e-12 for e, t in zip(s["static_equal_error"]["error_rate"], s["vcache"]["error_rate"]))
    assert 0.0 <= v["vcache"]["warm_share"] <= 1.0 and v["vcache"]["error_budget"] >= 0.0
    # contract v3: the mechanism ablation ran, and the regime's two smoke points
    assert h["mechanism"]["baseline"] == "vcache_global"
    g = report["regime"]
    assert g["parameter"] == "near_dup_share" and [p["value"] for p in g["points"]] == [0.0, 0.2]
    assert all(p["baseline"] == "static_threshold" and p["kind"] == "counted" for p in g["points"])
    # one seed per point: one sample, a tie, never an exact verdict (hit rates are declared non-deterministic)
    assert all(p["verdict"]["outcome"] == "ties" and not p["verdict"]["exact"] for p in g["points"])
    assert "hit_rate" not in report["deterministic_metrics"] and "model_calls" in report["deterministic_metrics"]
    assert g["headline_value"] == 0.1
    assert v["vcache_minilm"]["queries"] > 12  # real paraphrases were embedded
    assert any(k.endswith("minilm.npz") for k in storage.list("runs/vcache/"))
