"""Contract v4 for fluid: a straggler-slowdown point where FLuID or the fastest deployable baseline there
never reached the target accuracy in a seed is invalid (its time is the whole run, not a time to accuracy)."""
from __future__ import annotations

from mlsys_flows.systems.fluid import SPEC
from mlsys_flows.systems.fluid.result import _regime_sample

TIMES = {"fedavg_wait": [10.0, 11.0], "random_dropout": [8.0, 8.5], "ordered_dropout": [9.0, 9.5],
         "fluid": [7.5, 8.0], "fluid_static": [7.0, 7.2]}


def reached(**missed: int) -> dict[str, dict[str, list[float]]]:
    return {pol: {"reached_target": [0.0] * missed.get(pol, 0) + [1.0] * (2 - missed.get(pol, 0))} for pol in TIMES}


def test_the_compared_baseline_missing_the_target_makes_the_point_invalid():
    s = _regime_sample(2.0, TIMES, reached(random_dropout=1))
    assert not s.valid and s.invalid == "random_dropout missed the target accuracy in 1 of 2 seeds"


def test_only_fluid_and_the_fastest_deployable_baseline_count():
    assert _regime_sample(2.0, TIMES, reached(fedavg_wait=2, fluid_static=1)).valid
    assert "fluid missed" in _regime_sample(2.0, TIMES, reached(fluid=1)).invalid


def test_the_spec_declares_every_kind():
    assert SPEC.kinds["time_to_accuracy_s"] == "simulated" and SPEC.kinds["round_wall_s"] == "measured"
