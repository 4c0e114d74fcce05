"""Contract v4 for llama: the regime compares cost against the cheapest deployable static plan at each
duration factor, so a factor where the two sides' attainments differ by more than attainment_tolerance
and the cheaper side did not also meet more videos is invalid, by the same test as every repeat's pair
in the headline's notes; the spec declares every kind."""
from __future__ import annotations

import itertools

from mlsys_flows.systems.llama import SPEC, Params
from mlsys_flows.systems.llama import experiment as ex
from mlsys_flows.systems.llama.result import DEPLOYABLE, attainment_pairs, regime_sample

P = Params.for_scale("quick")   # the regime predicts the first 8 videos: steps of 1/8


def point(llama: float, best_static: float, cost: float = 1.0, all_cpu: float = 1.0, cpu_cost: float = 3.0,
          all_gpu: float = 1.0) -> dict[str, dict[str, float]]:
    return {"llama": {"cost": cost, "slo_attainment": llama},
            "best_static": {"cost": 0.8, "slo_attainment": best_static},
            "all_cpu": {"cost": cpu_cost, "slo_attainment": all_cpu},
            "all_gpu": {"cost": 2.0, "slo_attainment": all_gpu},
            "llama_once": {"cost": 1.1, "slo_attainment": 0.75}}


def test_a_cheaper_static_plan_that_met_fewer_videos_makes_the_point_invalid():
    s = regime_sample(P, 4.0, point(1.0, 0.75))
    assert not s.valid and "best_static met 2 video(s) fewer than llama and costs less" in s.invalid
    assert s.samples["best_static"] == [0.8] and s.kind == "modelled"


def test_a_cost_win_bought_with_missed_deadlines_is_invalid_and_only_the_baselines_lead_on_both_is_valid():
    assert "llama met 1 video(s) fewer" in regime_sample(P, 1.0, point(0.875, 1.0, cost=0.5)).invalid
    # llama cheaper and more videos: ahead on both, but the baseline did not reach llama's attainment
    ahead = regime_sample(P, 1.0, point(1.0, 0.875, cost=0.5))
    assert not ahead.valid and "llama is ahead on both, but best_static is not at llama's attainment" in ahead.invalid
    assert regime_sample(P, 1.0, point(0.875, 1.0)).valid                 # dearer and fewer: a loss on both
    assert regime_sample(P, 64.0, point(1.0, 1.0)).valid


def test_the_rival_is_the_cheapest_deployable_plan_all_cpu_included():
    assert DEPLOYABLE == ("best_static", "all_gpu", "all_cpu")
    s = regime_sample(P, 4.0, point(1.0, 1.0, all_cpu=0.625, cpu_cost=0.7))
    assert not s.valid and "all_cpu on 0.625" in s.invalid
    # a dearer deployable plan's attainment does not count
    assert regime_sample(P, 64.0, point(1.0, 1.0, all_gpu=0.5, all_cpu=0.5)).valid


def test_the_regime_and_the_headline_judge_equal_attainment_by_one_test():
    n = min(P.videos, P.regime_videos)
    for la, ba, cost in itertools.product((0.75, 0.875, 1.0), (0.75, 0.875, 1.0), (0.5, 1.0, 1.5)):
        valid = regime_sample(P, 1.0, point(la, ba, cost=cost)).valid
        pair, = attainment_pairs(P.model_copy(update={"videos": n}), "best_static", {"llama": [la], "best_static": [ba]},
                                 {"llama": [cost], "best_static": [0.8]})
        assert valid == pair["stands"], (la, ba, cost, pair)
        assert valid == ex.attainment_verdict(la, ba, n, 0.8 / cost, P.attainment_tolerance)["stands"]


def test_the_spec_declares_every_kind_and_the_deployable_plans():
    assert SPEC.role("all_cpu") == SPEC.role("best_static") == SPEC.role("all_gpu") == ("deployable",)
    assert SPEC.kinds["cost"] == "modelled" and SPEC.kinds["cold_start_s"] == "measured"
