"""The vcache flow at smoke scale (the session's shared reference run): counted hit and error rates
for vCache at three error bounds and the best static thresholds in hindsight, on both workloads."""
import math

from faultkit import reference_run


def test_vcache_flow_smoke(prefect_api):
    report, storage = reference_run("vcache")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("hit_rate", "static_threshold", "vcache", "counted")
    assert math.isfinite(h["ratio"]) or h["ratio"] == math.inf
    v, kinds = report["variants"], report["metric_kinds"]
    assert kinds["hit_rate"] == kinds["error_rate"] == "counted"
    for w in ("", "_minilm"):
        for lvl, d in (("_low", 0.01), ("", 0.02), ("_high", 0.05)):
            static, vc = v[f"static_threshold{lvl}{w}"], v[f"vcache{lvl}{w}"]
            assert static["error_rate"] <= d + 1e-12          # chosen in hindsight to meet delta
            assert 0.0 <= vc["hit_rate"] <= 1.0 and 0.0 <= vc["error_rate"] <= vc["hit_rate"]
            assert vc["delta"] == static["delta"] == d
        assert v[f"static_same_hits{w}"]["hit_rate"] >= v[f"vcache{w}"]["hit_rate"] or \
            v[f"static_same_hits{w}"]["threshold"] == 0.3
    assert v["vcache_minilm"]["queries"] > 12  # real paraphrases were embedded
    assert any(k.endswith("minilm.npz") for k in storage.list("runs/vcache/"))
