"""Contract v4 for llama: the regime compares cost, so a duration factor where Llama or the cheapest
deployable static plan there missed attainment_goal is invalid; the spec declares every kind."""
from __future__ import annotations

from mlsys_flows.systems.llama import SPEC, Params
from mlsys_flows.systems.llama.result import DEPLOYABLE, regime_sample


def point(llama: float, best_static: float, all_gpu: float = 1.0) -> dict[str, dict[str, float]]:
    return {"llama": {"cost": 1.0, "slo_attainment": llama},
            "best_static": {"cost": 0.8, "slo_attainment": best_static},
            "all_gpu": {"cost": 2.0, "slo_attainment": all_gpu},
            "llama_once": {"cost": 1.1, "slo_attainment": 0.75}}


def test_a_cheaper_static_plan_that_misses_the_goal_makes_the_point_invalid():
    p = Params.for_scale("smoke")  # attainment_goal 1.0
    s = regime_sample(p, 4.0, point(1.0, 0.75))
    assert not s.valid and "best_static met the SLO on 0.750" in s.invalid and "llama" not in s.invalid
    assert s.samples["best_static"] == [0.8] and s.kind == "modelled"


def test_llama_missing_the_goal_invalidates_and_both_meeting_it_is_valid():
    p = Params.for_scale("smoke")
    assert "llama met the SLO on 0.875" in regime_sample(p, 1.0, point(0.875, 1.0)).invalid
    assert regime_sample(p, 64.0, point(1.0, 1.0)).valid
    # only the plan the ratio is taken against counts: a dearer deployable plan's miss does not
    assert regime_sample(p, 64.0, point(1.0, 1.0, all_gpu=0.5)).valid


def test_the_spec_declares_every_kind_and_the_deployable_plans():
    assert DEPLOYABLE == ("best_static", "all_gpu")
    assert SPEC.kinds["cost"] == "modelled" and SPEC.kinds["cold_start_s"] == "measured"
