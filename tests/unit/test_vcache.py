"""vCache: the logistic fit and tau follow the paper's formulas; the batched replay equals the
sequential cache protocol; the verified policy's observed error stays within delta plus a stated
statistical slack over seeds, and the same check fails for a policy without the variance term and for
a lax static threshold; parameters are validated."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.vcache import (Params, SemanticCache, StaticThreshold, VerifiedPolicy, best_static,
                                        fit_logistic, paraphrase_corpus, replay, same_hits_static, sphere_stream,
                                        static_sweep, tau_star)
from mlsys_flows.systems.vcache.cache import LogisticFit
from scipy.stats import norm


def test_logistic_fit_recovers_threshold_and_delta_method_variance():
    rng = np.random.default_rng(0)
    s = rng.uniform(0.5, 1.0, 4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-40 * (s - 0.8)))).astype(int)
    fit = fit_logistic(s, y)
    assert fit is not None and not fit.separable
    assert abs(fit.t - 0.8) < 0.01 and 30 < fit.gamma < 50
    # the delta-method variance shrinks like 1/n
    small = fit_logistic(s[:400], y[:400])
    assert 4 < small.var_t / fit.var_t < 20


def test_fit_needs_both_labels_and_separable_data_gets_the_calibrated_variance():
    from mlsys_flows.systems.vcache.cache import separable_variance
    assert fit_logistic(np.array([0.9, 0.8, 0.95]), np.array([1, 1, 1])) is None
    fit = fit_logistic(np.array([0.5, 0.6, 0.85, 0.9, 0.95, 0.97]), np.array([0, 0, 1, 1, 1, 1]), separable_var_scale=2.0)
    assert fit.separable and fit.var_t == pytest.approx(2.0 * separable_variance(6))
    assert 0.6 < fit.t < 0.85


def test_anchors_let_an_entry_whose_labels_all_agree_be_served():
    """The authors' two pseudo-observations (wrong at 0, right at 1): an entry explored four times,
    always right at similarity ~0.9, is fitted as a separated sample and served well above its
    threshold; without anchors it could never be fitted and would explore forever."""
    from mlsys_flows.systems.vcache.cache import Entry
    e = Entry(response=0, obs_s=[0.9, 0.91, 0.92, 0.93], obs_y=[1, 1, 1, 1])
    rng = np.random.default_rng(0)
    with_anchors = VerifiedPolicy(0.05)
    assert with_anchors.n_obs(e) == 6 and with_anchors.current_fit(e).separable
    assert sum(with_anchors.decide(0.95, e, rng) for _ in range(200)) > 150
    without = VerifiedPolicy(0.05, anchors=False)
    e.obs_s += [0.9, 0.9]
    e.obs_y += [1, 1]
    e.fit = None
    assert not any(without.decide(0.99, e, rng) for _ in range(50))


def test_dense_eps_grid_removes_the_reference_grid_cap():
    """With the authors' 50 even eps points, delta = 1% and a moderately confident fit, tau* cannot
    fall below 1 - delta / 0.0204 (about 0.5); the dense grid reaches the minimum the formula allows."""
    from mlsys_flows.systems.vcache.cache import EPS_GRID_REFERENCE
    fit = LogisticFit(t=0.8, gamma=2000.0, var_t=0.02 ** 2, separable=True)  # steep: alpha ~ (1 - eps) above t'
    s = 0.8 + 3.0 * 0.02  # 3 sd above the threshold: beyond z(1 - delta) = 2.33, short of z(1 - 1e-6)
    coarse = tau_star(s, fit, 0.01, EPS_GRID_REFERENCE, norm.ppf(1 - EPS_GRID_REFERENCE))
    assert coarse >= 1 - 0.01 / EPS_GRID_REFERENCE[1] - 1e-9
    assert tau_star(s, fit, 0.01) < 0.05 < coarse


def test_tau_follows_the_formula():
    fit = LogisticFit(t=0.7, gamma=50.0, var_t=0.0004, separable=False)
    # far above the threshold: serve (tau 0); below it: explore nearly always
    assert tau_star(0.99, fit, 0.02) == 0.0
    assert tau_star(0.6, fit, 0.02) > 0.97
    # by hand for one eps: t' = t + z sd, alpha = (1-eps) sigmoid(gamma (s - t')), tau = 1 - delta/(1-alpha)
    from scipy.stats import norm
    eps, s, d = 0.1, 0.78, 0.05
    tp = 0.7 + norm.ppf(1 - eps) * 0.02
    alpha = (1 - eps) / (1 + math.exp(-50 * (s - tp)))
    one = 1 - d / (1 - alpha)
    got = tau_star(s, fit, d, eps_grid=np.array([eps]), z_grid=np.array([norm.ppf(1 - eps)]))
    assert got == pytest.approx(max(0.0, one))
    assert tau_star(s, fit, d) <= got + 1e-12  # the grid minimum is no larger


def _sequential(stream, policy, seed):
    c = SemanticCache(stream.vectors.shape[1], policy, model=lambda i: int(stream.labels[i]),
                      judge=lambda a, b: a == b, seed=seed)
    hits = errors = 0
    for i in range(len(stream)):
        r, hit, _ = c.lookup(i, stream.vectors[i])
        hits += hit
        errors += bool(hit and r != stream.labels[i])
    return hits, errors, len(c.entries)


@pytest.mark.parametrize("make", [lambda: StaticThreshold(0.85), lambda: VerifiedPolicy(0.05)])
def test_batched_replay_equals_the_sequential_cache(make):
    st = sphere_stream(1500, 150, 32, 5, 0.15, 1.0, 0.6, 0.9, 3)
    o = replay(st, make(), seed=1, block=64)
    assert (o.hits, o.errors, o.entries) == _sequential(st, make(), 1)


@pytest.mark.parametrize("k,floor", [(3, 0.5), (128, 0.9), (4, -np.inf)])
def test_static_sweep_from_neighbour_lists_equals_the_replay(k, floor):
    """A static cache holds exactly the prompts that missed: the sweep from each query's nearest earlier
    prompts (with the whole-cache search where the list cannot decide) equals replaying every threshold."""
    from mlsys_flows.systems.vcache.evaluate import causal_neighbours, static_outcomes
    st = sphere_stream(1500, 150, 32, 5, 0.15, 1.0, 0.6, 0.9, 3, 0.1)
    ts = [t for t in np.round(np.arange(0.3, 1.0001, 0.025), 4) if t >= floor]
    fast = static_outcomes(st, ts, causal_neighbours(st.vectors, k=k, floor=floor, block=97))
    for t, f in zip(ts, fast):
        o = replay(st, StaticThreshold(float(t)))
        assert (o.hits, o.errors, o.entries) == (f.hits, f.errors, f.entries), t
        assert (o.tail_hits, o.tail_errors, o.tail_queries) == (f.tail_hits, f.tail_errors, f.tail_queries), t
    assert [(o.hits, o.errors) for _, o in static_sweep(st, ts)] == [(o.hits, o.errors) for o in fast]
    with pytest.raises(ValueError, match="floor"):
        static_outcomes(st, [0.2], causal_neighbours(st.vectors, k=k, floor=0.5))


def test_wrong_exploration_adds_an_entry_and_right_one_does_not():
    v = np.eye(4, dtype=np.float32)
    c = SemanticCache(4, VerifiedPolicy(0.02), model=lambda p: p[1], judge=lambda a, b: a == b)
    c.lookup(("a", 0), v[0])
    near = (v[0] + 0.1 * v[1]) / np.linalg.norm(v[0] + 0.1 * v[1])
    c.lookup(("b", 0), near)            # same answer: observation (s, 1), no new entry
    assert len(c.entries) == 1 and c.entries[0].obs_y == [1]
    c.lookup(("c", 1), near)            # other answer: observation (s, 0), the prompt becomes an entry
    assert len(c.entries) == 2 and c.entries[0].obs_y == [1, 0]


SEEDS = range(3)
N = 3000


def _errors(policy_of, delta):
    out = []
    for seed in SEEDS:
        st = sphere_stream(N, 300, 32, 5, 0.15, 1.0, 0.6, 0.9, seed)
        out.append(replay(st, policy_of(delta), seed=seed).error_rate)
    return np.array(out)


def _within_bound(errors, delta):
    """Mean observed error over seeds <= delta + slack; slack = 3 binomial standard errors of the
    mean error rate over all seeds' queries (one-sided, about 0.1% false alarms)."""
    slack = 3 * math.sqrt(delta * (1 - delta) / (N * len(errors)))
    return errors.mean() <= delta + slack


@pytest.mark.parametrize("delta", [0.01, 0.05])
def test_verified_policy_meets_delta_over_seeds(delta):
    errs = _errors(lambda d: VerifiedPolicy(d), delta)
    assert _within_bound(errs, delta), errs
    # and the bound is not met by doing nothing: it serves hits
    st = sphere_stream(N, 300, 32, 5, 0.15, 1.0, 0.6, 0.9, 0)
    assert replay(st, VerifiedPolicy(delta)).hit_rate > 0.02


def test_the_bound_check_fails_for_broken_policies():
    # a lax static threshold breaks the bound
    assert not _within_bound(_errors(lambda d: StaticThreshold(0.6), 0.01), 0.01)

    # vCache without its confidence term (eps grid collapsed to the point estimate, no exploration
    # floor: a single observation suffices) is over-confident
    class Overconfident(VerifiedPolicy):
        def decide(self, s, entry, rng):
            fit = self.current_fit(entry) if len(entry.obs_s) >= 2 else None
            return fit is not None and 1 / (1 + math.exp(-fit.gamma * (s - fit.t))) > 0.5

    assert not _within_bound(_errors(lambda d: Overconfident(d, min_obs=2), 0.01), 0.01)


def test_best_static_in_hindsight_and_same_hits():
    st = sphere_stream(2000, 200, 32, 5, 0.15, 1.0, 0.6, 0.9, 0)
    sweep = static_sweep(st, np.round(np.arange(0.3, 1.0001, 0.05), 3))
    t, o = best_static(sweep, 0.02)
    assert o.error_rate <= 0.02
    assert all(x.hit_rate <= o.hit_rate for _, x in sweep if x.error_rate <= 0.02)
    with pytest.raises(ValueError):
        best_static([(0.5, sweep[0][1])], 1e-9) if sweep[0][1].error_rate > 0 else best_static([], 0.02)
    table = {"threshold": [t for t, _ in sweep], "hit_rate": [x.hit_rate for _, x in sweep],
             "error_rate": [x.error_rate for _, x in sweep]}
    m = same_hits_static(table, 0.3)
    assert m["hit_rate"] >= 0.3


def test_paraphrase_corpus_is_distinct_and_zipf():
    texts, labels = paraphrase_corpus(20, 30, 0.9, 0)
    assert len(set(texts)) == len(texts)
    counts = np.bincount(labels)
    assert counts.max() == 30 and counts.min() >= 1 and len(counts) == 20


@pytest.mark.parametrize("bad", [dict(delta=0.0), dict(delta_low=0.03), dict(sphere_queries=10),
                                 dict(minilm_classes=500), dict(scale_min=2.0, scale_max=1.0)])
def test_bad_parameters_are_rejected(bad):
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", **bad)
