"""BAGEL workloads. ``digits``: sklearn's bundled handwritten digits (1797 8x8 images shipped with
scikit-learn: nothing downloaded) projected to 16 dimensions by PCA, as passage embeddings. Each
query has two relevant "topics" far apart in the embedding space (two digit classes whose centroids
are among the most distant pairs): the passages nearest each class centroid are relevant, graded
relevance decays with the distance to the nearer centre, and the query lies near one of the two
centres, so the dense retriever's neighbourhood holds only one of them. Relevance follows the topic:
a passage of either class is graded by its distance to its class centre, any other passage is 0."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def digits_embeddings(dim: int, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings [1797, dim], digit labels). ``normalize``: rows scaled to unit length (cosine geometry,
    as a text embedder such as MiniLM gives); else scaled so the mean squared norm is 1."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = d.data.astype(np.float64)
    X = X - X.mean(0)
    _, _, vt = np.linalg.svd(X, full_matrices=False)
    Z = X @ vt[:dim].T
    if normalize:
        return Z / np.linalg.norm(Z, axis=1, keepdims=True), d.target.astype(np.int64)
    return Z / np.sqrt((Z ** 2).sum(1).mean()), d.target.astype(np.int64)


@dataclass
class Query:
    q: np.ndarray            # query embedding
    relevance: np.ndarray    # true graded relevance in [0, 1] of every passage
    relevant: np.ndarray     # ids of the relevant passages (both clusters)
    near: np.ndarray         # ids of the relevant passages in the query's own cluster
    noise: np.ndarray        # the scorer's noise draw per passage (common to every method)
    classes: tuple[int, int]


def make_queries(X: np.ndarray, labels: np.ndarray, n_queries: int, per_cluster: int, query_noise: float,
                 far_quantile: float, relevance_width: float, seed: int) -> list[Query]:
    """``relevance_width``: a relevant class's passages are graded exp(-ln 2 (d / h)^2), d their distance to
    the class centroid, h = relevance_width x the class radius (median distance of a class's items to its
    centroid); passages of other classes have relevance 0."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    cent = np.stack([X[labels == c].mean(0) for c in classes])
    dist = np.linalg.norm(cent[:, None] - cent[None], axis=-1)
    iu = np.triu_indices(len(classes), 1)
    cut = np.quantile(dist[iu], far_quantile)
    pairs = [(a, b) for a, b in zip(*iu) if dist[a, b] >= cut]
    radius = float(np.median([np.median(np.linalg.norm(X[labels == c] - cent[i], axis=1))
                              for i, c in enumerate(classes)]))
    h = relevance_width * radius
    out = []
    for _ in range(n_queries):
        a, b = pairs[rng.integers(len(pairs))]
        if rng.random() < 0.5:
            a, b = b, a
        ina, inb = labels == classes[a], labels == classes[b]
        da = np.where(ina, np.linalg.norm(X - cent[a], axis=1), np.inf)
        db = np.where(inb, np.linalg.norm(X - cent[b], axis=1), np.inf)
        near = np.argsort(da, kind="stable")[:per_cluster]
        far = np.argsort(db, kind="stable")[:per_cluster]
        rel_ids = np.unique(np.concatenate([near, far]))
        # a passage of either topic is graded by its distance to its topic's centre (0.5 at h), others 0
        relevance = np.exp(-np.log(2.0) * (np.minimum(da, db) / h) ** 2)
        anchor = near[rng.integers(per_cluster)]
        q = X[anchor] + query_noise * rng.standard_normal(X.shape[1]) * np.sqrt((X ** 2).sum(1).mean() / X.shape[1])
        out.append(Query(q, relevance, rel_ids, near, rng.standard_normal(len(X)), (int(classes[a]), int(classes[b]))))
    return out


def noisy_oracle(query: Query, noise: float):
    """The offline scorer: true relevance plus Gaussian noise (a fixed draw per passage, so every method
    sees the same score for the same passage), clipped to [0, 1]; ``calls`` counts its calls."""
    def score(i: int) -> float:
        score.calls += 1
        return float(np.clip(query.relevance[i] + noise * query.noise[i], 0.0, 1.0))

    score.calls = 0
    return score
