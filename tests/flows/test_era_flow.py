"""The ERA flow at smoke scale (the session's shared reference run): three variants with counted
success rates per level and per seed, equal RL environment steps for rl_scratch and prior_rl, the
prior stage's demonstrations counted apart, measured training time, curves and cells on storage; contract
v3: the headline is what RL adds to the prior, the prior's ablation is RL from scratch, and the RL budget
is the regime; issue 50: learning rates calibrated on other tasks first, the mechanism undecidable when RL
from scratch solves nothing, the components listed."""
import json
import math

from faultkit import reference_run

VARIANTS = ("rl_scratch", "prior_only", "prior_rl")


def test_era_flow_smoke(prefect_api):
    report, storage = reference_run("era")
    h = report["headline"]
    assert (h["metric"], h["baseline"], h["technique"], h["kind"]) == ("failure_rate", "prior_only", "prior_rl", "counted")
    assert h["vs_strongest"]["baseline"] in ("rl_scratch", "prior_only")
    assert h["mechanism"]["baseline"] == "rl_scratch" and h["mechanism"]["kind"] == "counted"
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
    assert [c["title"].split(",")[1].split(":")[0].strip() for c in report["curves"]
            if c["title"].startswith("RL stage")] == ["high level", "low level"]
    # the regime: RL budgets 0 and rl_env_steps at smoke; with no RL step prior + RL is the prior (ratio 1), and
    # the full budget is the headline's own runs
    g = report["regime"]
    assert g["parameter"] == "rl_env_steps" and [p["value"] for p in g["points"]] == [0.0, float(params["rl_env_steps"])]
    assert g["headline_value"] == params["rl_env_steps"] and all(p["kind"] == "counted" for p in g["points"])
    assert g["points"][0]["ratio"] == 1.0 and g["points"][0]["baseline"] == "prior_only"
    last = g["points"][-1]
    assert last["ratio"] == (h["ratio"] if last["baseline"] == "prior_only" else h["vs_strongest"]["ratio"])
    cell = json.loads(storage.read_bytes(f"runs/era/{report['run_id']}/cell_low_seed0.json"))
    assert cell["overlaps_dropped"] >= 0 and cell["prior"]["expert_successes"] == cell["prior"]["demo_episodes"]
    # issue 50: the learning rates were calibrated on other tasks before the evaluated cells, which used them
    calibration = next(n for n in report["notes"] if n.startswith("Learning rates, calibrated"))
    assert f"generator seed {params['seed'] + params['calibration_offset']}" in calibration
    assert cell["lr"]["rl_scratch"] in params["lr_grid_scratch"] and cell["lr"]["prior_rl"] in params["lr_grid_prior_rl"]
    assert f"rl_scratch low: chose {cell['lr']['rl_scratch']:g}" in calibration
    # the mechanism's verdict is undecidable exactly when RL from scratch solved no test task
    scratch_zero = all(x == 0 for x in report["samples"]["rl_scratch"]["success_rate"])
    assert h["mechanism"]["verdict"]["why"].startswith("undecidable") == scratch_zero
    assert {c["provenance"] for c in report["components"]} == {"learned", "scripted", "packaged"}
