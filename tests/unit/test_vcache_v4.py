"""Contract v4 for vcache: a class-confusion regime point where vCache or the calibrated static threshold
broke delta is invalid (hits bought by breaking the bound are no win), and the spec declares every kind."""
from __future__ import annotations

from mlsys_flows.systems.vcache import SPEC, Params
from mlsys_flows.systems.vcache.result import _regime_sample


def point(vcache_err: float, static_err: float) -> dict[str, dict[str, float]]:
    return {"vcache": {"hit_rate": 0.30, "error_rate": vcache_err},
            "vcache_global": {"hit_rate": 0.15, "error_rate": 0.01},
            "static_threshold": {"hit_rate": 0.46, "error_rate": static_err}}


def test_a_point_where_the_static_threshold_broke_delta_is_invalid_and_says_so():
    p = Params.for_scale("smoke")  # delta 0.02
    s = _regime_sample(p, 0.05, point(0.0052, 0.0258))
    assert not s.valid and "static_threshold error 0.0258 > delta 0.02" in s.invalid and "vcache " not in s.invalid
    assert s.samples["static_threshold"] == [0.46] and s.kind == "counted"


def test_vcache_breaking_delta_invalidates_too_and_both_within_it_is_valid():
    p = Params.for_scale("smoke")
    assert "vcache error 0.0300" in _regime_sample(p, 0.2, point(0.03, 0.01)).invalid
    ok = _regime_sample(p, 0.1, point(0.0064, 0.0188))
    assert ok.valid and ok.invalid == ""


def test_every_metric_is_counted_in_the_spec():
    assert set(SPEC.kinds.values()) == {"counted"} and {"hit_rate", "error_rate", "delta_met"} <= set(SPEC.kinds)
