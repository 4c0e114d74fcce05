"""The ERA flow at smoke scale (the session's shared reference run): three variants with counted
success rates per level and per seed, equal RL environment steps for rl_scratch and prior_rl, the
prior stage's demonstrations counted apart, measured training time, curves and cells on storage."""
import json
import math

from faultkit import reference_run

VARIANTS = ("rl_scratch", "prior_only", "prior_rl")


def test_era_flow_smoke(prefect_api):
    report, storage = reference_run("era")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("failure_rate", "rl_scratch", "prior_rl", "counted")
    assert h["vs_strongest"]["baseline"] in ("rl_scratch", "prior_only")
    v, kinds, params = report["variants"], report["metric_kinds"], report["parameters"]
    assert set(v) == set(VARIANTS)
    assert kinds["failure_rate"] == kinds["success_rate"] == kinds["success_rate_high"] == kinds["success_rate_low"] == "counted"
    assert kinds["rl_env_steps"] == kinds["prior_demo_steps"] == "counted" and kinds["train_s"] == "measured"
    assert {"success_rate", "success_rate_high", "success_rate_low", "rl_env_steps"} <= set(report["deterministic_metrics"])
    seeds = params["seeds"]
    for name in VARIANTS:
        m, s = v[name], report["samples"][name]
        assert len(s["success_rate"]) == len(s["success_rate_high"]) == len(s["success_rate_low"]) == seeds
        for a, b, both in zip(s["success_rate_high"], s["success_rate_low"], s["success_rate"]):
            assert 0.0 <= a <= 1.0 and 0.0 <= b <= 1.0 and math.isclose(both, (a + b) / 2)
        assert [1.0 - x for x in s["success_rate"]] == s["failure_rate"]
        assert m["test_episodes"] == 2 * seeds * 6 * params["test_per_subset"]
        assert m["train_s"] > 0
    # equal RL budget, prior data counted apart
    assert v["rl_scratch"]["rl_env_steps"] == v["prior_rl"]["rl_env_steps"] == 2 * params["rl_env_steps"]
    assert v["prior_only"]["rl_env_steps"] == 0 and v["rl_scratch"]["prior_demo_steps"] == 0
    assert v["prior_only"]["prior_demo_steps"] == v["prior_rl"]["prior_demo_steps"] > 0
    assert [c["title"].split(",")[1].split(":")[0].strip() for c in report["curves"]] == ["high level", "low level"]
    cell = json.loads(storage.read_bytes(f"runs/era/{report['run_id']}/cell_low_seed0.json"))
    assert cell["overlaps_dropped"] >= 0 and cell["prior"]["expert_successes"] == cell["prior"]["demo_episodes"]
