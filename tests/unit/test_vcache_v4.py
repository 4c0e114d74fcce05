"""Contract v4 for vcache: a class-confusion regime point where vCache or the calibrated static threshold
broke delta is invalid (hits bought by breaking the bound are no win), and the spec declares every kind."""
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
    assert s.samples["static_threshold"] == [0.46] and s.kind == "counted"


def test_vcache_breaking_delta_with_more_hits_invalidates_and_both_within_it_is_valid():
    p = Params.for_scale("smoke")
    broke = point(0.03, 0.01)
    broke["vcache"]["hit_rate"] = 0.50      # more hits than the static threshold, bought by breaking delta
    assert "vcache error 0.0300" in _regime_sample(p, 0.2, broke).invalid
    assert not _regime_sample(p, 0.2, point(0.03, 0.03)).valid          # both broke delta
    ok = _regime_sample(p, 0.1, point(0.0064, 0.0188))
    assert ok.valid and ok.invalid == ""


def test_the_side_within_delta_with_more_hits_leads_on_both_and_the_point_counts():
    """A side that broke delta AND served fewer hits loses on both counts: the point stands (not a win
    for the side that broke delta), whichever side that is."""
    p = Params.for_scale("smoke")
    assert _regime_sample(p, 0.2, point(0.03, 0.01)).valid                 # vcache broke, fewer hits: a loss
    static_broke = point(0.0052, 0.0258)
    static_broke["static_threshold"]["hit_rate"] = 0.20                    # static broke delta with fewer hits
    assert _regime_sample(p, 0.05, static_broke).valid
    stands, why = comparison_stands(static_broke, p.delta)
    assert stands and "static_threshold error 0.0258 > delta 0.02" in why and "leads on both" in why


def _seed(vc_hit, vc_err, st_hit, st_err, full=False):
    m = lambda h, e: {"hit_rate": h, "error_rate": e, "error_budget": e / 0.02, "delta_met": float(e <= 0.02),
                      "threshold": 0.97, "warm_share": 0.5, "queries": 100.0}
    r = {"vcache": m(vc_hit, vc_err), "static_threshold": m(st_hit, st_err), "static_oracle": m(0.4, 0.019),
         "vcache_global": m(0.2, 0.01), "static_equal_error": m(0.3, 0.005),
         "_sweep": {"threshold": [0.9, 1.0], "hit_rate": [0.5, 0.0], "error_rate": [0.05, 0.0]}}
    if full:
        r |= {k: m(0.3, 0.005) for k in ("vcache_low", "vcache_high", "static_threshold_low", "static_threshold_high")}
    return r


def test_the_headline_pairs_only_the_seeds_where_the_comparison_stands():
    p = Params.for_scale("smoke", seeds=4)
    per_seed = [_seed(0.30, 0.006, 0.35, 0.012, full=True), _seed(0.30, 0.006, 0.45, 0.025),   # static bought hits
                _seed(0.40, 0.006, 0.35, 0.030), _seed(0.38, 0.007, 0.33, 0.010)]              # static broke, fewer
    mini = {"vcache": {k: {"hit_rate": 0.1, "error_rate": 0.0, "queries": 50.0} for k in ("vcache", "vcache_low", "vcache_high")},
            "static": {"_sweep": {"threshold": [0.9], "hit_rate": [0.1], "error_rate": [0.0]},
                       **{k: {"hit_rate": 0.2, "error_rate": 0.0} for k in ("static_oracle", "static_oracle_low", "static_oracle_high")}}}
    points = {0.0: _seed(0.3, 0.005, 0.4, 0.01), 0.2: _seed(0.3, 0.005, 0.4, 0.01)}
    res = build_result(p, per_seed, mini, points)
    assert res.samples["vcache"]["hit_rate"] == [0.30, 0.40, 0.38]
    assert res.samples["static_threshold"]["hit_rate"] == [0.35, 0.35, 0.33]
    assert all(len(res.samples[v]["hit_rate"]) == 3 for v in res.samples)   # the pairs stay aligned
    notes = " ".join(res.notes)
    assert "seed 1: static_threshold error 0.0250 > delta 0.02" in notes and "bought by breaking the bound" in notes
    assert "Error budget used" in notes and "static_threshold 0.60, 1.25, 1.50, 0.50" in notes


def test_every_metric_is_counted_in_the_spec():
    assert set(SPEC.kinds.values()) == {"counted"} and {"hit_rate", "error_rate", "delta_met"} <= set(SPEC.kinds)
