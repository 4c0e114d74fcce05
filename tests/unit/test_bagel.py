"""BAGEL's pure code: the GP posterior against the closed form, UCB picks the max-UCB point, the budget
is never exceeded, and the workload has two distant relevant clusters with the query near one."""
import numpy as np
import pytest

from mlsys_flows.systems.bagel import (BagelConfig, GPHyper, Params, bagel, dense_rank, digits_embeddings,
                                       evaluate_queries, gp_posterior, make_queries, noisy_oracle, recall_at_k,
                                       rerank_top_b, ucb_beta, ucb_pick)
from mlsys_flows.systems.common.params import ParamsError


def closed_form_1d(x_star, x_obs, y_obs, ls, s2, n2, m):
    """Exact GP posterior at one point from two observations, written out by hand (2x2 inverse)."""
    k = lambda a, b: s2 * np.exp(-(a - b) ** 2 / (2 * ls ** 2))
    a, b = k(x_obs[0], x_obs[0]) + n2, k(x_obs[0], x_obs[1])
    d = k(x_obs[1], x_obs[1]) + n2
    det = a * d - b * b
    inv = np.array([[d, -b], [-b, a]]) / det
    ks = np.array([k(x_star, x_obs[0]), k(x_star, x_obs[1])])
    mu = m + ks @ inv @ (np.asarray(y_obs) - m)
    var = s2 - ks @ inv @ ks
    return mu, np.sqrt(var)


@pytest.mark.parametrize("x_star", [-1.0, 0.3, 0.5, 2.5])
def test_gp_posterior_matches_closed_form(x_star):
    h = GPHyper(lengthscale=0.7, signal_var=0.5, noise_var=0.05, mean=0.1)
    xo, yo = np.array([0.0, 1.0]), np.array([0.9, 0.2])
    mu, sd = gp_posterior(np.array([[x_star]]), xo[:, None], yo, h)
    emu, esd = closed_form_1d(x_star, xo, yo, 0.7, 0.5, 0.05, 0.1)
    assert mu[0] == pytest.approx(emu, abs=1e-10) and sd[0] == pytest.approx(esd, abs=1e-10)
    # a broken posterior (noise left out of K) is told apart by the same check
    bad_mu, _ = gp_posterior(np.array([[x_star]]), xo[:, None], yo, GPHyper(0.7, 0.5, 1e-9, 0.1))
    assert abs(bad_mu[0] - emu) > 1e-4


def test_posterior_interpolates_and_reverts_to_prior():
    h = GPHyper(lengthscale=0.5, signal_var=1.0, noise_var=1e-6, mean=0.0)
    X = np.array([[0.0], [1.0], [50.0]])
    mu, sd = gp_posterior(X, X[:2], np.array([0.8, -0.3]), h)
    assert mu[:2] == pytest.approx([0.8, -0.3], abs=1e-4) and sd[:2].max() < 1e-2
    assert mu[2] == pytest.approx(0.0, abs=1e-9) and sd[2] == pytest.approx(1.0, abs=1e-9)


def test_ucb_picks_the_max_ucb_unscored_point():
    rng = np.random.default_rng(0)
    mu, sd = rng.random(200), rng.random(200)
    scored = np.zeros(200, bool)
    scored[rng.choice(200, 50, replace=False)] = True
    beta = 1.7
    i = ucb_pick(mu, sd, beta, scored)
    u = mu + beta * sd
    assert not scored[i] and u[i] == u[~scored].max()
    # the best point overall, once scored, is never picked again
    scored[int(np.argmax(u))] = True
    assert ucb_pick(mu, sd, beta, scored) != int(np.argmax(u))
    # beta really trades exploration: a huge beta follows sd, zero beta follows mu
    free = np.zeros(200, bool)
    assert ucb_pick(mu, sd, 0.0, free) == int(np.argmax(mu))
    assert ucb_pick(mu, sd, 1e9, free) == int(np.argmax(sd))
    assert ucb_beta(10, 1000) > ucb_beta(1, 1000) > 0


@pytest.fixture(scope="module")
def workload():
    X, labels = digits_embeddings(16)
    return X, labels, make_queries(X, labels, 4, 10, 0.15, 0.5, 1.0, seed=3)


def test_workload_two_distant_clusters(workload):
    X, labels, qs = workload
    for q in qs:
        far = np.setdiff1d(q.relevant, q.near)
        assert len(q.relevant) == 20 and len(far) == 10
        d_near = np.linalg.norm(X[q.near] - q.q, axis=1).mean()
        d_far = np.linalg.norm(X[far] - q.q, axis=1).mean()
        assert d_far > 2 * d_near
        # the dense retriever's neighbourhood misses the far cluster
        assert recall_at_k(dense_rank(X, q.q), far, 20) == 0.0


def test_budget_never_exceeded(workload):
    X, _, qs = workload
    for q in qs[:2]:
        sc = noisy_oracle(q, 0.05)
        tr = bagel(X, dense_rank(X, q.q), sc, [3, 12, 25], BagelConfig(seeds=5, refit_every=3))
        assert sc.calls == 25 == len(tr.scored) == len(set(tr.scored))
        assert sorted(tr.rankings) == [3, 12, 25]
        # the ranking at budget b only ranks the first b scored passages by score
        assert set(tr.rankings[12][:12].tolist()) == set(tr.scored[:12])
        assert sorted(tr.rankings[25].tolist()) == list(range(len(X)))
        sc2 = noisy_oracle(q, 0.05)
        rerank_top_b(dense_rank(X, q.q), sc2, 17)
        assert sc2.calls == 17


def test_budget_check_catches_an_overspending_method(workload, monkeypatch):
    X, _, qs = workload
    import mlsys_flows.systems.bagel.evaluate as ev

    real = ev.bagel

    def greedy(X, order, scorer, budgets, cfg):  # a broken BAGEL that spends one call more
        tr = real(X, order, scorer, budgets, cfg)
        scorer(int(order[-1]))
        return tr

    monkeypatch.setattr(ev, "bagel", greedy)
    with pytest.raises(RuntimeError, match="budget"):
        evaluate_queries(X, qs[:1], [8], BagelConfig(seeds=3), 0.05)


def test_evaluate_reports_every_method(workload):
    X, _, qs = workload
    res = evaluate_queries(X, qs[:2], [6, 12], BagelConfig(seeds=3, refit_every=3), 0.05)
    for m in ("dense", "rerank", "bagel"):
        assert all(0.0 <= r <= 1.0 for r in res["recall"][m][12]) and len(res["recall"][m][6]) == 2
    assert res["calls"]["rerank"][12] == [12, 12] and res["calls"]["bagel"][6] == [6, 6]


def test_params_reject_bad_values():
    with pytest.raises(ParamsError, match="budget"):
        Params.for_scale("smoke", budget=0)
    with pytest.raises(ParamsError, match="seeds"):
        Params.for_scale("smoke", seeds=50, budget=10)
    assert 10 in Params.for_scale("smoke").budgets() and Params.for_scale("quick").budgets()[-1] == 60


def test_explore_variant_spends_the_same_budget(workload):
    X, _, qs = workload
    res = evaluate_queries(X, qs[:1], [10], BagelConfig(seeds=3, refit_every=3), 0.05, explore_beta_scale=1.0)
    assert set(res["recall"]) == {"dense", "rerank", "bagel", "bagel_explore"}
    assert res["calls"]["bagel_explore"][10] == res["calls"]["bagel"][10] == [10]
