"""Contract v4 for vcache: vCache and the calibrated static threshold are compared only where both met
delta (issue 47): a regime point where either broke it is invalid and says who; every seed reaches the
harness, whose declared constraint counts only the seeds where both met delta; and the spec declares every kind."""
from __future__ import annotations

from mlsys_flows.systems.vcache import SPEC, Params
from mlsys_flows.systems.vcache.result import _regime_sample, build_result, comparison_stands


def point(vcache_err: float, static_err: float) -> dict[str, dict[str, float]]:
    return {"vcache": {"hit_rate": 0.30, "error_rate": vcache_err},
            "vcache_global": {"hit_rate": 0.15, "error_rate": 0.01},
            "static_threshold": {"hit_rate": 0.46, "error_rate": static_err}}


def test_a_point_where_the_static_threshold_broke_delta_is_invalid_and_says_so():
    p = Params.for_scale("smoke")  # delta 0.02
    s = _regime_sample(p, 0.05, point(0.0052, 0.0258))
    assert not s.valid and "static_threshold error 0.0258 > delta 0.02" in s.invalid and "vcache error" not in s.invalid
    assert "static_threshold broke delta" in s.invalid
    assert s.samples["static_threshold"] == [0.46] and s.kind == "counted"


def test_vcache_breaking_delta_invalidates_and_both_within_it_is_valid():
    p = Params.for_scale("smoke")
    broke = point(0.03, 0.01)
    broke["vcache"]["hit_rate"] = 0.50      # more hits than the static threshold, bought by breaking delta
    assert "vcache error 0.0300" in _regime_sample(p, 0.2, broke).invalid
    assert not _regime_sample(p, 0.2, broke).valid
    assert not _regime_sample(p, 0.2, point(0.03, 0.01)).valid            # vcache broke delta with fewer hits
    both = _regime_sample(p, 0.2, point(0.03, 0.03))
    assert not both.valid and "both broke delta" in both.invalid
    ok = _regime_sample(p, 0.1, point(0.0064, 0.0188))
    assert ok.valid and ok.invalid == ""


def test_a_side_that_broke_delta_invalidates_the_point_with_more_hits_or_fewer():
    """Issue 47's rule: compared only where both met delta. The old rule let a point stand where the side
    that broke delta served fewer hits (counting it for the other side: a selection on the outcome); now
    it is invalid either way, and says who broke delta (the review of 2026-12-06, BLOCKER 1)."""
    p = Params.for_scale("smoke")
    more = point(0.0052, 0.0258)                                           # static broke delta, more hits
    fewer = point(0.0052, 0.0258)
    fewer["static_threshold"]["hit_rate"] = 0.20                           # static broke delta, fewer hits
    for pt in (more, fewer):
        s = _regime_sample(p, 0.05, pt)
        assert not s.valid and "static_threshold error 0.0258 > delta 0.02" in s.invalid
        stands, why = comparison_stands(pt, p.delta)
        assert not stands and why == s.invalid


def _seed(vc_hit, vc_err, st_hit, st_err, full=False):
    m = lambda h, e: {"hit_rate": h, "error_rate": e, "error_budget": e / 0.02, "delta_met": float(e <= 0.02),
                      "threshold": 0.97, "warm_share": 0.5, "queries": 100.0}
    r = {"vcache": m(vc_hit, vc_err), "static_threshold": m(st_hit, st_err), "static_oracle": m(0.4, 0.019),
         "vcache_global": m(0.2, 0.01), "static_equal_error": m(0.3, 0.005),
         "_sweep": {"threshold": [0.9, 1.0], "hit_rate": [0.5, 0.0], "error_rate": [0.05, 0.0]}}
    if full:
        r |= {k: m(0.3, 0.005) for k in ("vcache_low", "vcache_high", "static_threshold_low", "static_threshold_high")}
    return r


def _mini():
    return {"vcache": {k: {"hit_rate": 0.1, "error_rate": 0.0, "queries": 50.0} for k in ("vcache", "vcache_low", "vcache_high")},
            "static": {"_sweep": {"threshold": [0.9], "hit_rate": [0.1], "error_rate": [0.0]},
                       **{k: {"hit_rate": 0.2, "error_rate": 0.0} for k in ("static_oracle", "static_oracle_low", "static_oracle_high")}}}


def test_every_seed_reaches_the_harness_which_pairs_only_the_seeds_where_both_met_delta():
    """M4: the result no longer drops seeds itself (so the harness's constraint check could never fire):
    every seed's samples reach build_report, whose per-pair rule counts only the seeds where both met
    delta; vCache breaking delta on a seed is never a win there."""
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment

    p = Params.for_scale("smoke", seeds=4)
    per_seed = [_seed(0.30, 0.006, 0.35, 0.012, full=True), _seed(0.30, 0.006, 0.45, 0.025),   # static bought hits
                _seed(0.40, 0.006, 0.35, 0.030), _seed(0.38, 0.007, 0.33, 0.010)]              # static broke, fewer
    points = {0.0: _seed(0.3, 0.005, 0.4, 0.01), 0.2: _seed(0.3, 0.005, 0.4, 0.01)}
    res = build_result(p, per_seed, _mini(), points)
    assert res.samples["vcache"]["hit_rate"] == [0.30, 0.30, 0.40, 0.38]
    assert res.samples["static_threshold"]["error_rate"] == [0.012, 0.025, 0.030, 0.010]
    assert all(len(res.samples[v]["hit_rate"]) == 4 for v in res.samples)   # the pairs stay aligned
    notes = " ".join(res.notes)
    assert "seed 1: static_threshold error 0.0250 > delta 0.02" in notes
    assert "seed 2: static_threshold error 0.0300 > delta 0.02" in notes and "the 2 of 4 seeds where both" in notes
    assert "fewer than the 6 a verdict needs" in notes
    assert "Error budget used" in notes and "static_threshold 0.60, 1.25, 1.50, 0.50" in notes
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")
    rep = build_report(SPEC, params=p.model_dump(mode="json"), result=res, run_id="r", environment=env,
                       wall_time_s=1.0)
    c = rep.constraint
    assert (c.pairs, c.pairs_standing, c.pairs_counted) == (4, 2, 2) and c.bound == 0.02
    v = rep.headline.vs_strongest.verdict
    assert v.outcome == "ties" and "2 of 4 pairs stand" in v.why
    # vCache breaking delta on 3 of 8 seeds with more hits: those seeds are dropped, 5 stand, a tie (before: a win)
    p8 = Params.for_scale("smoke", seeds=8)
    seeds8 = [_seed(0.40, 0.030 if i < 3 else 0.006, 0.30, 0.010, full=i == 0) for i in range(8)]
    rep8 = build_report(SPEC, params=p8.model_dump(mode="json"), result=build_result(p8, seeds8, _mini(), points),
                        run_id="r", environment=env, wall_time_s=1.0)
    assert rep8.constraint.pairs_standing == 5 and rep8.headline.vs_strongest.verdict.outcome == "ties"
    seeds8 = [_seed(0.40, 0.030 if i < 2 else 0.006, 0.30, 0.010, full=i == 0) for i in range(8)]
    rep6 = build_report(SPEC, params=p8.model_dump(mode="json"), result=build_result(p8, seeds8, _mini(), points),
                        run_id="r", environment=env, wall_time_s=1.0)
    assert rep6.constraint.pairs_standing == 6 and rep6.headline.vs_strongest.verdict.outcome == "wins"


def test_single_seed_comparisons_are_ties_not_exact():
    """A regime point is one seed: its hit rates are counts, but one draw of the workload, so its verdict
    is a tie (one sample), never 'exact' (the review's MAJOR 4); the derived counts stay deterministic."""
    from mlsys_flows.systems.common.report import build_report
    from mlsys_flows.systems.common.runreport import Environment

    p = Params.for_scale("smoke", seeds=1)
    m = lambda h, e: {"hit_rate": h, "error_rate": e, "model_calls": 100 * (1 - h), "hit_precision": 1 - e / h}
    res = build_result(p, [_seed(0.30, 0.006, 0.20, 0.012, full=True)], _mini(),
                       {w: {"vcache": m(0.3, 0.005), "vcache_global": m(0.2, 0.005), "static_threshold": m(h, 0.01)}
                        for w, h in ((0.0, 0.1), (0.2, 0.12))})
    assert not {"hit_rate", "error_rate"} & set(res.deterministic_metrics(res.variants))
    assert {"model_calls", "hit_precision", "cache_entries"} <= res.deterministic
    env = Environment(device="cpu", cores=2, platform="x", versions={}, git_sha="abc", git_dirty=False, code_hash="c0de")
    rep = build_report(SPEC, params={"scale": "smoke"}, result=res, run_id="r", environment=env, wall_time_s=1.0)
    assert all(pt.valid and pt.ratio > 1 and pt.verdict.outcome == "ties" and not pt.verdict.exact
               for pt in rep.regime.points)
    assert rep.regime.wins == "undecided" and rep.regime.crossover is None


def test_static_same_hits_is_paired_by_seed():
    p = Params.for_scale("smoke", seeds=2)
    a, b = _seed(0.30, 0.006, 0.35, 0.012, full=True), _seed(0.45, 0.008, 0.35, 0.012)
    a["_sweep"] = {"threshold": [0.9, 0.95, 1.0], "hit_rate": [0.6, 0.3, 0.0], "error_rate": [0.05, 0.01, 0.0]}
    b["_sweep"] = {"threshold": [0.9, 0.95, 1.0], "hit_rate": [0.6, 0.3, 0.0], "error_rate": [0.04, 0.01, 0.0]}
    res = build_result(p, [a, b], _mini(), {0.0: _seed(0.3, 0.005, 0.4, 0.01), 0.2: _seed(0.3, 0.005, 0.4, 0.01)})
    # seed 0's vCache (0.30 hits) meets 0.95 on seed 0's sweep; seed 1's (0.45) needs 0.9 on seed 1's
    assert res.samples["static_same_hits"]["error_rate"] == [0.01, 0.04]


def test_every_metric_is_counted_in_the_spec():
    assert set(SPEC.kinds.values()) == {"counted"} and {"hit_rate", "error_rate", "delta_met"} <= set(SPEC.kinds)
