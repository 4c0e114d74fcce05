"""Contract v4 for metropolis: the flow's result is assembled in systems/metropolis/result.py, and with
llm=sleep (a real-time replay of the drawn latencies) the timed metrics are emulated, never measured."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common.report import ContractError, build_report
from mlsys_flows.systems.common.runreport import Environment
from mlsys_flows.systems.metropolis import POLICIES, SPEC, Params
from mlsys_flows.systems.metropolis.result import build_result

ENV = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")


def outputs(makespans: dict[str, float]):
    sim = {"llm_calls": 40.0, "cluster_steps": 20.0, "conversations": 3.0, "max_clock_spread": 2.0,
           "utilization": 0.5, "steps_match_global": 1.0, "digest": "d", "progress": [(0.0, 0.0), (1.0, 8.0)]}
    planned = [{"digest": "d", "sweep": {n: [] for n in POLICIES},
                "policies": {n: sim | {"makespan_s": m + 0.01 * r} for n, m in makespans.items()}} for r in range(3)]
    runs = {n: [{"makespan_s": m + 0.1 * r, "utilization": 0.5, "max_clock_spread": 2, "digest": "d",
                 "cluster_steps": 20.0, "llm_calls": 40.0} for r in range(3)] for n, m in makespans.items()}
    sweep = {1: {n: [m, m + 0.1, m + 0.2] for n, m in makespans.items()},
             6: {n: [m * 1.1, m * 1.2, m * 1.3] for n, m in makespans.items()}}
    return planned, [0.05, 0.06], runs, sweep


def report(llm: str):
    p = Params.for_scale("smoke", llm=llm)
    result = build_result(p, *outputs({"global_sync": 2.0, "out_of_order": 1.5, "oracle": 1.2}))
    return result, build_report(SPEC, params=p.model_dump(mode="json"), result=result, run_id="r", environment=ENV,
                                wall_time_s=1.0)


def test_a_replayed_llm_makes_the_timed_metrics_emulated_with_what_they_emulate():
    result, rep = report("sleep")
    assert set(result.emulated) == {"makespan_s", "utilization", "max_clock_spread"}
    assert all("replayed" in why for why in result.emulated.values())
    assert {rep.metric_kinds[m] for m in result.emulated} == {"emulated"}
    assert rep.headline.kind == "emulated" and rep.headline.assumptions
    # the scheduler's own cost stays measured: the slept time cancels against the simulated clock
    assert rep.metric_kinds["orchestration_overhead_s"] == rep.metric_kinds["prefect_task_overhead_s"] == "measured"
    assert any("emulated, not measured" in n for n in rep.notes)


def test_the_harness_refuses_the_replay_labelled_measured():
    result, _ = report("sleep")
    result.kinds = {}
    with pytest.raises(ContractError, match="injected cost"):
        build_report(SPEC, params={"scale": "smoke"}, result=result, run_id="r", environment=ENV, wall_time_s=1.0)


def test_every_metric_has_its_kind_in_the_spec():
    _, rep = report("sleep")
    assert set(rep.metric_kinds) <= set(SPEC.kinds)


def test_each_repeat_is_a_town_of_its_own_shared_by_every_policy():
    """Repeat r is the town of seed + r: the repeats are independent pairs over towns (they were reruns
    of one seeded town, whose interval spans only the timing jitter); the simulated metrics are one
    sample per town and the equivalence is checked town by town."""
    from mlsys_flows.systems.metropolis import simulate

    p = Params.for_scale("smoke", llm="sleep")
    assert p.config() == p.config(repeat=0) and p.config(repeat=2).seed == p.seed + 2
    towns = [simulate("global_sync", p.config(repeat=r), p.llm_slots) for r in range(3)]
    assert len({g.digest for g in towns}) == 3
    result = build_result(p, *outputs({"global_sync": 2.0, "out_of_order": 1.5, "oracle": 1.2}))
    assert result.samples["global_sync"]["sim_makespan_s"] == [2.0, 2.01, 2.02]
    assert result.variants["oracle"] == {"state_matches_global": 1.0} and result.deterministic == {"state_matches_global"}
    # the regime: one sample per town at every radius
    assert [len(pt.samples["out_of_order"]) for pt in result.regime] == [3, 3]
    # a timed run that stepped other clusters than its town's plan is not equivalent, whatever its digest
    planned, probe, runs, sweep = outputs({"global_sync": 2.0, "out_of_order": 1.5, "oracle": 1.2})
    runs["out_of_order"][2]["cluster_steps"] = 19.0
    assert build_result(p, planned, probe, runs, sweep).variants["out_of_order"]["state_matches_global"] == 0.0
