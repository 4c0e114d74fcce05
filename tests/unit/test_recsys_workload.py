"""The family's workload (systems/recsys_embeddings/workload.py): popularity correlated across a
sample's tables by a Gaussian copula while each table keeps its calibrated Zipf marginal."""
import math

import numpy as np
import pytest
from scipy.stats import kstest

from mlsys_flows.systems.common.embeddings import calibrated_exponent, top_share, zipf_weights
from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recsys_embeddings.workload import copula_uniforms, generate, table_rows

KW = dict(samples=30_000, test_samples=1_000, num_tables=8, rows_max=2_000, dense_features=4, coverage=0.5,
          signal=1.5, seed=3, hot_share=0.76)


def local_ids(ds) -> np.ndarray:
    return ds.ids - ds.offsets[:-1]


def expected_top_share(rows: int, coverage: float, hot_share: float) -> float:
    reachable = max(1, round((coverage if rows > 1000 else 1.0) * rows))
    return top_share(zipf_weights(reachable, calibrated_exponent(reachable, 0.07, hot_share)), 0.07)


def hot_masks(ds) -> np.ndarray:
    """bool [N, T]: the id is among its table's hottest 7% of reachable rows (ranked by counts)."""
    loc = local_ids(ds)
    out = np.zeros(loc.shape, bool)
    for t, r in enumerate(table_rows(ds.num_tables, KW["rows_max"])):
        reachable = max(1, round((KW["coverage"] if r > 1000 else 1.0) * r))
        counts = np.bincount(loc[:, t], minlength=r)
        top = np.argsort(-counts, kind="stable")[:max(1, math.ceil(0.07 * reachable))]
        out[:, t] = np.isin(loc[:, t], top)
    return out


@pytest.fixture(scope="module")
def by_rho():
    return {rho: generate(**KW, popularity_correlation=rho) for rho in (0.0, 0.3, 0.6, 0.9)}


@pytest.mark.parametrize("rho", [0.0, 0.6])
def test_each_table_keeps_its_calibrated_skew(by_rho, rho):
    ds = by_rho[rho]
    loc = local_ids(ds)
    rows = table_rows(ds.num_tables, KW["rows_max"])
    for t, r in enumerate(rows):
        if r < 100:  # a table too small for its top 7% to be more than a row or two
            continue
        counts = np.sort(np.bincount(loc[:, t], minlength=r))[::-1]
        reachable = max(1, round((KW["coverage"] if r > 1000 else 1.0) * r))
        k = max(1, math.ceil(0.07 * reachable))
        share = counts[:k].sum() / counts.sum()
        assert share == pytest.approx(expected_top_share(int(r), KW["coverage"], KW["hot_share"]), abs=0.02), t
    # and the whole marginal, not only its top: sorted frequencies as at rho 0 (total variation)
    base = local_ids(by_rho[0.0])
    for t, r in enumerate(rows):
        a = np.sort(np.bincount(base[:, t], minlength=r))[::-1] / len(base)
        b = np.sort(np.bincount(loc[:, t], minlength=r))[::-1] / len(loc)
        assert 0.5 * np.abs(a - b).sum() < 0.05, t


def test_all_hot_inputs_rise_with_the_correlation(by_rho):
    shares = [hot_masks(by_rho[rho]).all(axis=1).mean() for rho in (0.0, 0.3, 0.6, 0.9)]
    assert all(a < b for a, b in zip(shares, shares[1:])), shares
    assert shares[2] > 3 * shares[0]


def test_zero_correlation_is_independent_tables(by_rho):
    """At 0 a sample's tables are independent: the all-hot share is the product of the per-table hot
    shares and two tables' hot indicators are uncorrelated; at 0.6 they are not."""
    for rho, independent in ((0.0, True), (0.6, False)):
        hot = hot_masks(by_rho[rho])
        product = float(np.prod(hot.mean(axis=0)))
        all_hot = float(hot.all(axis=1).mean())
        pair = np.corrcoef(hot[:, 0], hot[:, 2])[0, 1]
        if independent:
            assert all_hot == pytest.approx(product, abs=0.01) and abs(pair) < 0.03
        else:
            assert all_hot > 3 * product and pair > 0.1


def test_copula_uniforms_are_uniform_and_zero_returns_them_unchanged():
    g = np.random.default_rng(0)
    own, shared = g.random(20_000), g.standard_normal(20_000)
    assert copula_uniforms(own, shared, 0.0) is own
    for rho in (0.3, 0.9, 1.0):
        u = copula_uniforms(own, shared, rho)
        assert u.min() >= 0 and u.max() < 1 and kstest(u, "uniform").pvalue > 1e-3


def test_deterministic_per_seed_and_only_the_ids_change_with_the_correlation(by_rho):
    again = generate(**KW, popularity_correlation=0.6)
    a = by_rho[0.6]
    assert np.array_equal(a.ids, again.ids) and np.array_equal(a.labels, again.labels)
    other = generate(**dict(KW, seed=4), popularity_correlation=0.6)
    assert not np.array_equal(a.ids, other.ids)
    # the generator's stream is the same at every correlation: the dense features and the offsets agree
    assert np.array_equal(a.dense, by_rho[0.0].dense) and np.array_equal(a.offsets, by_rho[0.0].offsets)
    assert a.hot_share == by_rho[0.0].hot_share  # the calibrated skew is the tables' own


def test_bad_correlation_names_the_field():
    with pytest.raises(ValueError, match="popularity_correlation"):
        generate(**KW, popularity_correlation=1.5)
    from mlsys_flows.systems.fae import Params

    with pytest.raises(ParamsError, match="popularity_correlation"):
        Params.for_scale("smoke", popularity_correlation=-0.1)
    assert Params.for_scale("smoke").popularity_correlation == 0.6
