"""vCache, contract v3: the global-threshold ablation pools every entry's observations into one fit;
the deployable static threshold is calibrated on a held-out stream; the equal-error baseline sits on
the static frontier; the regime's confusion levels are validated."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.vcache import (CALIBRATION_TRAFFIC, GlobalVerifiedPolicy, Params, SemanticCache,
                                        VerifiedPolicy, calibrate, calibration, equal_error_static, replay,
                                        run_stream, sphere_stream, static_sweep)


def _cache(policy):
    return SemanticCache(2, policy, model=lambda p: p[1], judge=lambda a, b: a == b)


def test_global_policy_pools_observations_across_entries():
    pol = GlobalVerifiedPolicy(0.05, min_obs=10)  # stays in warm-up: every lookup explores
    c = _cache(pol)
    a, b = np.array([1.0, 0.0], np.float32), np.array([0.0, 1.0], np.float32)
    c.lookup(("x", 0), a)
    c.lookup(("y", 1), b)  # explores entry 0 at similarity 0: wrong, so b becomes entry 1
    assert len(c.entries) == 2
    c.resolve(("x2", 0), a, 0, 0.95)
    c.resolve(("y2", 1), b, 1, 0.95)
    # three explorations of two entries: the pool holds all three, the entries none
    assert pol.pool.obs_y == [0, 1, 1] and all(not e.obs_s for e in c.entries)
    # the per-entry policy keeps them apart
    per = VerifiedPolicy(0.05, min_obs=10)
    c2 = _cache(per)
    c2.lookup(("x", 0), a)
    c2.resolve(("x2", 0), a, 0, 0.95)
    assert c2.entries[0].obs_s == [0.95]


def test_global_policy_serves_entries_it_never_explored():
    """With a pooled fit, an entry with no observations of its own may be served (vCache never does)."""
    st = sphere_stream(3000, 100, 32, 5, 0.15, 1.0, 0.3, 0.9, 0)
    g, v = GlobalVerifiedPolicy(0.05), VerifiedPolicy(0.05)
    og, ov = replay(st, g), replay(st, v)
    assert og.hit_rate > ov.hit_rate and g.fits < v.fits


def test_calibrate_and_equal_error_static():
    st = sphere_stream(2000, 200, 32, 5, 0.15, 1.0, 0.6, 0.9, 1)
    sweep = static_sweep(st, np.round(np.arange(0.5, 1.0001, 0.05), 3))
    th = calibrate(sweep, {"mid": 0.02, "none": 0.0})
    ok = [(t, o) for t, o in sweep if o.error_rate <= 0.02]
    assert th["mid"] == max(ok, key=lambda to: to[1].hit_rate)[0]
    assert th["none"] in (1.0, max(t for t, o in sweep if o.error_rate == 0))
    t, o = equal_error_static(sweep, 0.005)
    assert o.error_rate <= 0.005
    assert all(x.hit_rate <= o.hit_rate for _, x in sweep if x.error_rate <= 0.005)


def test_run_stream_uses_the_given_threshold_not_the_streams_own():
    p = Params.for_scale("smoke")
    st = p.sphere(p.seed, shrink=2)
    out = run_stream(st, {"mid": 0.99}, p.deltas(), sweep_thresholds=p.thresholds())
    assert out["static_threshold"]["threshold"] == 0.99
    assert out["static_oracle"]["hit_rate"] >= out["static_threshold"]["hit_rate"] or \
        out["static_threshold"]["error_rate"] > p.delta
    assert out["vcache_global"]["delta"] == p.delta and out["vcache"]["delta_met"] in (0.0, 1.0)


def test_calibration_traffic_is_the_same_world_with_other_prompts():
    """The deployable threshold is calibrated on held-out traffic of the evaluated stream's world (the
    review of 2026-12-06, MAJOR 3): same class centres and popularity, other prompts; traffic None is the
    evaluated stream itself."""
    args = (3000, 60, 32, 5, 0.15, 1.0, 1e-4, 0.9, 3, 0.1)   # within 1e-4: a prompt is its class's centre
    ev, cal, other = sphere_stream(*args), sphere_stream(*args, traffic=CALIBRATION_TRAFFIC), sphere_stream(*args[:8], 4, 0.1)
    assert np.array_equal(ev.vectors, sphere_stream(*args, traffic=None).vectors)
    assert not np.array_equal(ev.labels, cal.labels)
    for c in set(ev.labels[:50].tolist()) & set(cal.labels.tolist()):
        assert float(ev.vectors[ev.labels == c][0] @ cal.vectors[cal.labels == c][0]) > 0.999   # the same centre
    shared = set(ev.labels.tolist()) & set(other.labels.tolist())
    assert any(float(ev.vectors[ev.labels == c][0] @ other.vectors[other.labels == c][0]) < 0.99 for c in shared)


def test_calibration_uses_a_fine_grid_and_extends_it_downwards():
    p = Params.for_scale("smoke")
    grid = p.calibration_thresholds()
    assert {0.95, 0.951, 0.983, 0.999, 1.0} <= set(np.round(grid, 6).tolist()) and grid.min() == 0.95
    th = calibration(p, 0)
    assert set(th) == {"low", "mid", "high"} and all(t in set(grid.tolist()) for t in th.values())
    assert th["low"] >= th["mid"] >= th["high"] and set(calibration(p, 1)) == {"mid"}
    loose = calibration(Params.for_scale("smoke", delta_high=0.45), 0)   # 0.95 meets 0.45: the sweep goes below it
    assert loose["high"] < 0.95


@pytest.mark.parametrize("bad", [dict(regime_near_dup=[0.5]), dict(regime_near_dup=[0.5, 0.5]),
                                 dict(regime_near_dup=[0, 1]), dict(near_dup_share=1.0), dict(near_dup_offset=0.0)])
def test_bad_regime_levels_are_rejected(bad):
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", **bad)
