"""Contract v4 in the harness (issue 43): every comparison of a report carries its verdict (paired,
exact or a tie), a system whose samples are turns of one run never wins on them, an emulated metric
lists what it emulates, the crossover uses only regime points where both sides met their constraint
(the others drawn hollow), and a report made before v4 is judged by the same rules when shown."""
from __future__ import annotations

import pytest

from mlsys_flows.rendering import (regime_phrase, summary_markdown, table_description, table_rows, v3_cells,
                                   verdict_of, verdict_text)
from mlsys_flows.systems.common.report import (Assumption, ContractError, RegimeSample, SystemResult, build_report)
from mlsys_flows.systems.common.runreport import Environment
from mlsys_flows.systems.common.spec import Claim, Mechanism, Regime, SystemSpec
from mlsys_flows.systems.common.verdict import judge, of_report

CLAIM = Claim("t", "base", "tech", "lower", 2.0, "2x faster", headline=True)
ENV = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")
BASE = [10.0, 10.5, 9.8, 10.2, 10.1, 9.9, 10.3, 10.0]
TECH = [5.0, 5.2, 4.9, 5.1, 5.0, 5.3, 4.8, 5.0]  # about 2x faster in every pair


def spec(**kw) -> SystemSpec:
    args = dict(name="demo", title="Demo", paper="p", family="f", claims=(CLAIM,), baselines=("base",),
                roles={"base": ("paper", "deployable")}, mechanism=Mechanism("trick", "no_trick"),
                regime=Regime("skew"))
    return SystemSpec(**(args | kw))


def report(s: SystemSpec, n: int = 8, kind: str = "measured", **kw):
    samples = {"base": {"t": BASE[:n]}, "tech": {"t": TECH[:n]}, "no_trick": {"t": BASE[:n]}}
    result = SystemResult(variants={}, kinds={"t": kind}, samples=samples, **kw)
    return build_report(s, params={"scale": "quick"}, result=result, run_id="r", environment=ENV, wall_time_s=1.0)


def test_every_comparison_of_a_report_carries_its_verdict():
    h = report(spec()).headline
    for r in (h, h.vs_strongest, h.mechanism):
        assert r.verdict.outcome == "wins" and r.verdict.pairs == 8 and r.verdict.interval[0] > 1
    assert h.verdict.ratio == pytest.approx(2.0, rel=0.05)


def test_three_repeats_decide_nothing_however_they_fall():
    v = report(spec(), n=3).headline.verdict
    assert v.outcome == "ties" and v.interval is None and v.ratio > 1.9 and "fewer than 6" in v.why


def test_samples_that_are_turns_of_one_run_never_win():
    v = report(spec(pairing="turns")).headline.verdict
    assert v.outcome == "ties" and v.pairs == 1 and v.why == "pairs not independent"
    with pytest.raises(ValueError, match="pairing must be one of"):
        spec(pairing="epochs")


def test_a_deterministic_result_is_exact_and_a_seed_sweep_of_one_is_paired():
    exact = judge([100.0, 100.0, 100.0], [80.0, 80.0, 80.0], "lower", deterministic=True)
    assert exact.exact and exact.outcome == "wins" and exact.ratio == pytest.approx(1.25)
    seeds = judge([100.0, 90.0, 95.0], [80.0, 85.0, 70.0], "lower", deterministic=True)  # counted, per seed
    assert not seeds.exact and seeds.outcome == "ties" and seeds.pairs == 3
    one = judge([10.0], [5.0], "lower", deterministic=False)  # a single timing
    assert one.outcome == "ties" and one.why == "one sample"
    zero = judge([0.0, 0.0], [1.0, 2.0], "higher", deterministic=False)
    assert zero.outcome == "ties" and zero.ratio is None and zero.label() == "ties (a pair has no finite ratio)"


def test_an_emulated_metric_lists_what_it_emulates():
    with pytest.raises(ContractError, match="emulated metric 't' lists no assumptions"):
        report(spec(), kind="emulated")
    r = report(spec(), kind="emulated",
               assumptions={"t": {"slow_tier_row_s": Assumption(value=2e-6, unit="s", source="a sleep per row "
                                                                 "standing for an SSD read (the paper's Table 2)")}})
    assert r.headline.kind == "emulated" and r.headline.verdict.outcome == "wins"


def sweep(points: dict[float, tuple[float, bool]]) -> list[RegimeSample]:
    """The technique takes 1 s at each point and the baseline ``ratio`` s; ``valid``: both met the constraint."""
    return [RegimeSample(value=v, samples={"tech": [1.0], "base": [r]}, kind="counted", valid=ok,
                         invalid="" if ok else "base broke the error bound (0.026 > 0.02)")
            for v, (r, ok) in points.items()]


def test_the_crossover_never_rests_on_a_point_where_a_side_broke_its_constraint():
    points = {1.0: (1.5, True), 2.0: (0.5, False), 3.0: (1.4, True)}
    r = report(spec(), kind="counted", regime=sweep(points))
    g = r.regime
    assert g.wins == "everywhere" and g.crossover is None  # with the invalid point: a band, two crossings
    assert [p.valid for p in g.points] == [True, False, True] and "error bound" in g.points[1].invalid
    assert g.points[0].verdict.exact and g.points[0].verdict.outcome == "wins"
    curve = r.curves[-1]
    assert curve.hollow == [next(n for n in curve.series if "broke its constraint" in n)]
    assert curve.series[curve.hollow[0]] == ([2.0], [0.5])
    phrase = regime_phrase(g.model_dump())
    assert phrase.startswith("ratio > 1 over all of skew 1-3") and "1 of 3 points left out" in phrase
    assert "(2 of 2 points decided: 2 wins)" in phrase
    # a tie at the end of the sweep is no part of the span "everywhere" covers
    tied_end = report(spec(), kind="counted", regime=sweep({1.0: (1.5, True), 2.0: (1.4, True), 3.0: (1.0, True)}))
    assert regime_phrase(tied_end.regime.model_dump()).startswith("ratio > 1 over all of skew 1-2 ")
    for broken in ({1.0: (1.5, False), 2.0: (0.5, False)}, {1.0: (1.5, True), 2.0: (0.5, False), 3.0: (0.4, False)}):
        undecided = report(spec(), regime=sweep(broken)).regime  # one valid point says nothing of a crossover
        assert undecided.crossover is None and undecided.wins == "undecided"
        assert regime_phrase(undecided.model_dump()).startswith("undecided over skew")


def test_a_regime_of_ties_says_so():
    r = report(spec(), regime=sweep({1.0: (1.5, True), 2.0: (0.5, True)}))  # measured, one sample a point
    # a tie says nothing about the side of 1: no crossover from ties, the ratios stay on the curve
    assert r.regime.wins == "undecided" and r.regime.crossover is None
    assert regime_phrase(r.regime.model_dump()) == ("undecided over skew 1-2: 0 of 2 points decided (a crossover "
                                                    "needs 2; the ratios are on the curve)")


def test_a_zero_on_the_better_side_is_an_exact_win_not_a_missing_ratio():
    v = judge([3.0], [0.0], "lower", deterministic=True)  # the technique stalls 0 s, the baseline 3 s
    assert v.exact and v.outcome == "wins" and v.ratio is None and "technique's value is 0" in v.why
    assert judge([0.0], [0.0], "lower", deterministic=True).outcome == "ties"


def test_the_mechanism_and_the_table_artifact_show_verdicts_not_bare_ratios():
    r = report(spec(), n=3)
    cells = v3_cells(r.model_dump(mode="json"))
    assert cells["mechanism"].startswith("ties ") and cells["mechanism"].endswith("vs no_trick")
    rows = table_rows(r)
    assert all(row["verdict"].startswith("ties") for row in rows)
    # the verdict's cell stays narrow whatever its reason says; the reason is in the last column
    assert all(len(row["verdict"]) <= 40 and list(row)[-1] == "why" for row in rows)
    long_why = judge([2.0], [1.0], "lower", deterministic=False)  # one sample: a tie whose reason is free text
    assert long_why.interval is None and long_why.short() == f"ties {long_why.label().split()[1]}"
    assert long_why.why and long_why.why not in long_why.short()
    assert "ties" in table_description(r).split(";")[0]


def test_a_report_made_before_v4_of_a_system_with_turns_never_wins_when_shown(monkeypatch):
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from mlsys_flows import registry

    # recd paired its training turns when this report was made (it pairs evaluated seeds since issue 45)
    monkeypatch.setattr(registry, "get", lambda name: SimpleNamespace(pairing="turns"))

    # recd's quick report as committed before v4 (246ccdb; its later reports pair by evaluated seed), trimmed
    committed = json.loads((Path(__file__).resolve().parent / "data" / "recd-quick-before-v4.json").read_text())
    for r in (committed.get("headline") or {}, (committed.get("headline") or {}).get("vs_strongest") or {}):
        r.pop("verdict", None)
    v = verdict_of(committed)
    assert v.outcome == "ties" and v.why == "pairs not independent"


def test_a_report_made_before_v4_is_judged_by_the_same_rules_when_shown():
    fresh = report(spec()).model_dump(mode="json")
    old = {**fresh, "headline": {**fresh["headline"], "verdict": None,
                                 "vs_strongest": {**fresh["headline"]["vs_strongest"], "verdict": None}}}
    assert of_report(old) == of_report(fresh)
    assert of_report({**old, "samples": {}}).why == "one sample"
    assert verdict_text(fresh).startswith("wins 2.0") and verdict_text(fresh).endswith("vs base")


def test_the_verdict_comes_first_in_the_run_summary():
    md = summary_markdown(report(spec(), n=3))
    first = next(line for line in md.splitlines() if line.startswith("**"))
    assert first.startswith("**Verdict**") and "ties" in first


# --- item 2 and item 6: kinds declared by the spec; an injected cost is never measured ---

def _spec_with_kinds(**kinds):
    return SystemSpec(name="toy", title="t", paper="p", family="f",
                      claims=(Claim("time_s", "base", "tech", "lower", headline=True),), kinds=kinds)


def _result(**kw):
    return SystemResult(variants={"base": {"time_s": 2.0}, "tech": {"time_s": 1.0}}, **kw)


def test_the_spec_declares_the_kinds_and_a_result_may_override_one():
    report = build_report(_spec_with_kinds(time_s="measured"), params={"scale": "smoke"}, result=_result(),
                          run_id="r", environment=ENV, wall_time_s=1.0)
    assert report.metric_kinds == {"time_s": "measured"}
    spec = _spec_with_kinds(time_s="measured")
    over = _result(kinds={"time_s": "emulated"}, assumptions={"time_s": {"llm": Assumption(value=1.0, source="x")}})
    report = build_report(spec, params={"scale": "smoke"}, result=over, run_id="r", environment=ENV, wall_time_s=1.0)
    assert report.metric_kinds == {"time_s": "emulated"}
    with pytest.raises(ContractError, match="without a kind: time_s"):
        build_report(_spec_with_kinds(), params={"scale": "smoke"}, result=_result(), run_id="r", environment=ENV,
                     wall_time_s=1.0)
    with pytest.raises(ValueError, match="unknown kinds"):
        _spec_with_kinds(time_s="timed")


def test_a_measured_label_on_an_emulated_path_fails():
    spec = _spec_with_kinds(time_s="measured")
    with pytest.raises(ContractError, match="time_s took an injected cost .*slow tier.*labelled measured"):
        build_report(spec, params={"scale": "smoke"}, result=_result(emulated={"time_s": "a slow tier (sleep)"}),
                     run_id="r", environment=ENV, wall_time_s=1.0)
    points = [RegimeSample(value=v, samples={"base": [2.0], "tech": [1.0]}, kind="measured") for v in (1, 2)]
    with pytest.raises(ContractError, match="regime took an injected cost"):
        build_report(spec, params={"scale": "smoke"}, result=_result(regime=points, emulated={"regime": "sleep"}),
                     run_id="r", environment=ENV, wall_time_s=1.0)


def test_a_headline_off_the_papers_operating_point_must_say_why():
    points = [RegimeSample(value=v, samples={"base": [2.0], "tech": [1.0]}, kind="counted") for v in (1, 2)]
    kw = dict(params={"scale": "smoke"}, run_id="r", environment=ENV, wall_time_s=1.0)
    claims = (Claim("time_s", "base", "tech", "lower", headline=True),)
    off = SystemSpec(name="toy", title="t", paper="p", family="f", claims=claims, kinds={"time_s": "counted"},
                     regime=Regime("skew", paper_value=3.0))
    with pytest.raises(ContractError, match="not at the paper's 3; the spec's regime must say why"):
        build_report(off, result=_result(regime=points, regime_headline_value=1.0), **kw)
    build_report(off, result=_result(regime=points, regime_headline_value=3.0), **kw)
    said = SystemSpec(name="toy", title="t", paper="p", family="f", claims=claims, kinds={"time_s": "counted"},
                      regime=Regime("skew", paper_value=3.0, operating_point_reason="3 needs a GPU; 1 stands in"))
    assert build_report(said, result=_result(regime=points, regime_headline_value=1.0), **kw) \
        .regime.operating_point_reason.startswith("3 needs")
    # no paper point: the spec's reason for its operating point is kept, not blanked (a review found it lost)
    free = SystemSpec(name="toy", title="t", paper="p", family="f", claims=claims, kinds={"time_s": "counted"},
                      regime=Regime("skew", operating_point_reason="2 is where the mechanism can act"))
    assert build_report(free, result=_result(regime=points, regime_headline_value=2.0), **kw) \
        .regime.operating_point_reason == "2 is where the mechanism can act"


def test_a_regime_point_over_an_injected_cost_is_never_measured():
    spec = _spec_with_kinds(time_s="measured")
    kw = dict(params={"scale": "smoke"}, run_id="r", environment=ENV, wall_time_s=1.0)
    points = [RegimeSample(value=0, samples={"base": [2.0], "tech": [1.0]}, kind="measured"),
              RegimeSample(value=3, samples={"base": [2.0], "tech": [1.0]}, kind="measured", emulated="3 us per row")]
    with pytest.raises(ContractError, match="regime point.s. 3 took an injected cost .3 us per row."):
        build_report(spec, result=_result(regime=points), **kw)
    points[1].kind = "emulated"
    build_report(spec, result=_result(regime=points), **kw)


def test_a_reason_does_not_excuse_a_headline_off_a_paper_point_the_regime_reached():
    claims = (Claim("time_s", "base", "tech", "lower", headline=True),)
    kw = dict(params={"scale": "smoke"}, run_id="r", environment=ENV, wall_time_s=1.0)
    points = [RegimeSample(value=v, samples={"base": [2.0], "tech": [1.0]}, kind="counted") for v in (1, 3)]
    said = SystemSpec(name="toy", title="t", paper="p", family="f", claims=claims, kinds={"time_s": "counted"},
                      regime=Regime("skew", paper_value=3.0, operating_point_reason="not yet taken"))
    with pytest.raises(ContractError, match="paper.s skew = 3 is reachable .a regime point was measured there."):
        build_report(said, result=_result(regime=points, regime_headline_value=1.0), **kw)


def test_a_run_may_weaken_a_declared_kind_never_strengthen_it():
    kw = dict(params={"scale": "smoke"}, run_id="r", environment=ENV, wall_time_s=1.0)
    with pytest.raises(ContractError, match="relabels time_s measured .the spec declares emulated."):
        build_report(_spec_with_kinds(time_s="emulated"), result=_result(kinds={"time_s": "measured"}), **kw)
    with pytest.raises(ContractError, match="emulated names no metric of this run: tiem_s"):
        build_report(_spec_with_kinds(time_s="measured"), result=_result(emulated={"tiem_s": "a typo"}), **kw)
