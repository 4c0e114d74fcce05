"""DSI's result builder (contract v4): on CPU the trainer's step is real passes and its timings are measured;
on a GPU the step is padded with a sleep to step_ms, so every timed metric and the regime's points are
emulated, list step_ms as their assumption and pass the harness (which refuses them labelled measured);
the headline off the paper's point builds only because the spec says why."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common.report import ContractError, build_report
from mlsys_flows.systems.common.runreport import Environment
from mlsys_flows.systems.dsi import SPEC, Params
from mlsys_flows.systems.dsi.result import TIMED, VARIANTS, build_result

ENV = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")


def _metrics(sps: float) -> dict[str, float]:
    return {"trainer_samples_per_s": sps, "stall_fraction": 0.1, "wall_s": 1.0, "step_ms": 5.0, "workers_mean": 1.0,
            "workers_max": 1.0, "bytes_read": 100.0, "read_calls": 4.0, "samples": 512.0, "reissued_items": 0.0,
            "duplicates_dropped": 0.0, "final_loss": 0.69}


def _outputs(device: str):
    p = Params.for_scale("smoke")
    dpp = {"metrics": _metrics(120.0), "workers_over_time": [(0.0, 1), (1.0, 1)], "device": device,
           "pinning": {"trainer": {"pid": 1, "cores": [0]}, "pinned": {}, "note": "one core"}}
    runs = {"inline": [_metrics(100.0)], "inline_full_rows": [_metrics(90.0)], "dpp": [dpp],
            "dpp_colocated": [dict(dpp, metrics=_metrics(95.0))]}
    sweep = {"points": {x: {"inline": 100.0, "dpp": 110.0, "dpp_colocated": 95.0} for x in p.regime_extra_preprocess},
             "rounds": {x: 1 for x in p.regime_extra_preprocess}}
    cpu = {"note": "one core", "passes": 2, "pass_ms": 2.5, "rounds": 0, "round_ms": 0.1, "step_cpu_ms": 5.0,
           "trainer_cores": [0], "dpp_cores": [1], "extra_preprocess": p.extra_preprocess}
    data = {"items": list(range(6)), "prefix": "data", "stored_bytes": 1e6}
    return p, data, cpu, runs, sweep


def _report(result, p):
    return build_report(SPEC, params=p.model_dump(), result=result, run_id="r", environment=ENV, wall_time_s=1.0)


def test_cpu_passes_are_measured():
    p, *rest = _outputs("cpu")
    result = build_result(p, *rest, workers=2, want=1)
    assert set(VARIANTS) == set(result.variants) and not result.emulated and not result.kinds
    assert all(pt.kind == "measured" for pt in result.regime)
    report = _report(result, p)
    assert report.metric_kinds["trainer_samples_per_s"] == "measured"


def test_a_sleep_padded_gpu_step_is_emulated_and_says_what_it_stands_for():
    p, *rest = _outputs("cuda:0")
    result = build_result(p, *rest, workers=2, want=1)
    assert set(result.emulated) == {*TIMED, "regime"} and all(pt.kind == "emulated" for pt in result.regime)
    report = _report(result, p)
    assert report.metric_kinds["trainer_samples_per_s"] == "emulated"
    assert report.headline.assumptions["step_ms"].value == p.step_ms
    result.kinds = {}  # the same values labelled measured: the harness refuses them
    with pytest.raises(ContractError, match="injected cost"):
        _report(result, p)


def test_the_headline_sits_at_the_papers_point():
    from mlsys_flows.systems.dsi import Params

    assert SPEC.regime.paper_value == 1.27 and not SPEC.regime.operating_point_reason
    assert all(Params.for_scale(s).extra_preprocess == SPEC.regime.paper_value for s in ("smoke", "quick", "full"))


def test_the_headline_point_is_the_one_the_timed_runs_were_calibrated_for():
    """The regime's headline value comes from the CPU budget every timed run used (its rounds), not from
    a parameter read again: a budget calibrated off the paper's point is refused by the harness."""
    p, data, cpu, runs, sweep = _outputs("cpu")
    assert _report(build_result(p, data, cpu, runs, sweep, workers=3, want=2), p).regime.headline_value == 1.27
    off = dict(cpu, extra_preprocess=0.0)
    with pytest.raises(ContractError, match="extra_preprocess = 0.0"):
        _report(build_result(p, data, off, runs, sweep, workers=3, want=2), p)


def test_the_notes_show_the_controllers_decisions_and_say_when_workers_share_a_core():
    p, data, cpu, runs, sweep = _outputs("cpu")
    runs["dpp"][0] = dict(runs["dpp"][0], workers_over_time=[(0.0, 1), (0.05, 2), (0.9, 2), (1.0, 2)],
                          items_by_worker={"tcp://b": 2, "tcp://c": 4})
    notes = build_result(p, data, cpu, runs, sweep, workers=3, want=2).notes
    note = next(n for n in notes if n.startswith("DPP workers"))
    assert "0.00 s: 1, 0.05 s: 2;" in note and "tcp://b: 2, tcp://c: 4" in note
    assert "share that core's CPU" in note and "offered: 2, 2 per DPP core on 1 DPP core(s)" in note
    runs["dpp"][0] = dict(runs["dpp"][0], workers_over_time=[(0.0, 1), (1.0, 1)])
    note = next(n for n in build_result(p, data, cpu, runs, sweep, workers=2, want=1).notes
                if n.startswith("DPP workers"))
    assert "(no change)" in note and "share" not in note


def test_the_notes_list_every_decision_with_its_trigger_and_argue_inlines_one_core_limit():
    p, data, cpu, runs, sweep = _outputs("cpu")
    runs["dpp"][0] = dict(runs["dpp"][0], workers_over_time=[(0.0, 1), (0.05, 2), (1.0, 2)], decisions=[
        {"t": 0.05, "trigger": "start-up", "stall_fraction": 1.0, "queue_fill": 0.0, "before": 1, "target": 2},
        {"t": 0.55, "trigger": "regular", "stall_fraction": 0.3, "queue_fill": 0.0, "before": 2, "target": 2}])
    notes = build_result(p, data, cpu, runs, sweep, workers=3, want=2).notes
    note = next(n for n in notes if n.startswith("DPP workers"))
    assert "0.05 s start-up stall 1.00 fill 0.00: 1->2, 0.55 s regular stall 0.30 fill 0.00: 2->2" in note
    assert "the one change was the start-up event; the 1 regular decision(s) kept the count at the stall" in note
    limit = next(n for n in notes if n.startswith("Inline's loader_threads"))
    # step 5.0 ms + 0 rounds: at most batch_size / 5 ms; inline's median 100 samples/s
    assert f"= {1e3 * p.batch_size / 5.0:.0f} samples/s" in limit and "its median was 100 samples/s" in limit
