"""The Criteo-like workload shared by FAE, Hotline and Slipstream (pure numpy).

``num_tables`` sparse features, one id per table per sample (as in Criteo), table sizes those of the
26 Criteo Kaggle features compressed on a log scale so the largest has ``rows_max`` rows (a few large
tables, many small ones; cycled when there are more tables), row popularity Zipf
calibrated so the hottest ``hot_fraction`` of each table's reachable rows take ``hot_share`` of its
accesses (systems/common/embeddings.py). A sample's ids are drawn through a Gaussian copula: one
latent normal per sample, shared by all its tables with weight sqrt(``popularity_correlation``), plus
one independent normal per table, becomes a uniform that picks the table's row by inverting its
popularity-ranked CDF. Each table's marginal is exactly its calibrated Zipf for any correlation; the
correlation makes a sample that is popular in one table likely popular in the others (0: independent
tables, where almost no input is popular in all of them). Labels come from a hidden logistic model: a bias, a linear
term on the dense features and one hidden scalar per embedding row. One generator draws the data,
so a seed fixes the train/test split. Every id is a global row: ``offsets[t] + row`` (all tables
concatenated, as the slow tier stores them).
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from mlsys_flows.systems.common.embeddings import make_table, top_share


@dataclass(frozen=True)
class Dataset:
    dense: np.ndarray      # float32 [N, dense_features]
    ids: np.ndarray        # int64 [N, T] global rows
    labels: np.ndarray     # float32 [N]
    offsets: np.ndarray    # int64 [T + 1] first global row of each table
    train: int             # the first ``train`` samples train, the rest test
    bayes_logloss: float   # test logloss of the hidden model itself (the floor)
    hot_share: float       # counted: share of accesses of the hottest 7% rows (all tables)

    @property
    def total_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def num_tables(self) -> int:
        return len(self.offsets) - 1

    def split(self, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = slice(0, self.train) if part == "train" else slice(self.train, None)
        return self.dense[s], self.ids[s], self.labels[s]

    def head(self, train: int, test: int) -> "Dataset":
        """The first ``train`` training and first ``test`` test samples (the same tables and rows)."""
        tr, te = min(train, self.train), min(test, len(self.labels) - self.train)
        idx = np.r_[0:tr, self.train:self.train + te]
        return Dataset(self.dense[idx], self.ids[idx], self.labels[idx], self.offsets, tr, self.bayes_logloss,
                       self.hot_share)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, dense=self.dense, ids=self.ids, labels=self.labels, offsets=self.offsets,
                 meta=np.array([self.train, self.bayes_logloss, self.hot_share]))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Dataset":
        z = np.load(io.BytesIO(blob))
        meta = z["meta"]
        return cls(z["dense"], z["ids"], z["labels"], z["offsets"], int(meta[0]), float(meta[1]), float(meta[2]))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by ranks (ties averaged)."""
    from scipy.stats import rankdata

    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(scores)
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# Rows of the 26 categorical features of the Criteo Kaggle display-advertising data set.
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                      14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


def table_rows(num_tables: int, rows_max: int) -> np.ndarray:
    """Criteo Kaggle's table sizes, cycled to ``num_tables``, as rows**a with a chosen so the largest
    has ``rows_max`` rows (at least 2 rows each)."""
    card = np.array([CRITEO_KAGGLE_ROWS[t % len(CRITEO_KAGGLE_ROWS)] for t in range(num_tables)], np.float64)
    a = np.log(rows_max) / np.log(card.max())
    return np.maximum(2, np.round(card ** a)).astype(np.int64)


def copula_uniforms(own: np.ndarray, shared: np.ndarray, rho: float) -> np.ndarray:
    """Uniforms in [0, 1) correlated across tables by a Gaussian copula: ``own`` [n] uniforms of one
    table, ``shared`` [n] standard normals common to every table of a sample. Each result is uniform
    (its normal has unit variance), so the table's marginal does not depend on ``rho``; two tables'
    latent normals have correlation ``rho``. ``rho`` 0 returns ``own`` itself."""
    if rho == 0.0:
        return own
    from scipy.special import ndtr, ndtri

    # own uniforms as normals (the generator's stream stays the same for every rho)
    z = np.sqrt(rho) * shared + np.sqrt(1.0 - rho) * ndtri(np.clip(own, 1e-16, 1 - 1e-16))
    return np.minimum(ndtr(z), np.nextafter(1.0, 0.0))


def generate(*, samples: int, test_samples: int, num_tables: int, rows_max: int, dense_features: int,
             coverage: float, signal: float, seed: int, hot_share: float = 0.76,
             popularity_correlation: float = 0.0) -> Dataset:
    if not 0.0 <= popularity_correlation <= 1.0:
        raise ValueError(f"popularity_correlation must lie in [0, 1] (got {popularity_correlation})")
    g = np.random.default_rng([seed, 14])
    shared = np.random.default_rng([seed, 15]).standard_normal(samples + test_samples)
    rows = table_rows(num_tables, rows_max)
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    n = samples + test_samples
    ids = np.empty((n, num_tables), np.int64)
    probs_all = []
    for t, r in enumerate(rows):
        table = make_table(f"t{t}", int(r), 1, 1.0, coverage if r > 1000 else 1.0, g, 0.07, hot_share)
        # rows ranked hottest first, so a low uniform picks a popular row in every table alike (0: the row
        # order as it was, which draws the same marginal and keeps earlier data sets bit for bit)
        rank = np.argsort(-table.probs, kind="stable") if popularity_correlation > 0 else np.arange(r)
        cdf = np.cumsum(table.probs[rank])
        u = copula_uniforms(g.random(n), shared, popularity_correlation)
        local = rank[np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), r - 1)]
        ids[:, t] = offsets[t] + local
        probs_all.append(table.probs)
    # hidden logistic model: a per-row effect (rare rows matter as much as hot ones), dense weights
    effect = g.normal(0.0, signal / np.sqrt(num_tables), int(offsets[-1]))
    dense = g.normal(0.0, 1.0, (n, dense_features)).astype(np.float32)
    w_dense = g.normal(0.0, 0.5 / np.sqrt(dense_features), dense_features)
    logit = -1.1 + dense @ w_dense + effect[ids].sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (g.random(n) < p).astype(np.float32)
    bayes = logloss(labels[samples:], p[samples:])
    share = top_share(np.concatenate(probs_all) / num_tables, 0.07)
    return Dataset(dense, ids, labels, offsets, samples, bayes, share)
