"""Stochastic block model graph with community-ordered node ids, features and labels (numpy, pure).

Nodes ``comm_ptr[c] .. comm_ptr[c + 1] - 1`` form community ``c``: node ids are ordered by community,
as the paper's preprocessing reorders them, so a community's feature rows are contiguous in memory.
Each edge stays inside its source's community with probability ``homophily`` (else its endpoint is
uniform over the graph). Labels follow the community only loosely: a community has a dominant class
drawn at random, a node takes it with probability ``label_purity`` and a uniformly drawn class
otherwise. Features mix a class centroid, a community centroid and Gaussian noise, so neither a
node's own features nor its community alone give its label: the aggregated neighbourhood helps.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, fields

import numpy as np

from mlsys_flows.errors import MlsysError


class GraphError(MlsysError, ValueError):
    """A graph array is inconsistent; ``field`` names it."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"graph '{field}': {problem}")


@dataclass
class Graph:
    indptr: np.ndarray      # int64 [n + 1], CSR row pointers (symmetric adjacency)
    indices: np.ndarray     # int64 [edges], neighbours; per row, same-community neighbours first
    intra_end: np.ndarray   # int64 [n], end of the same-community neighbours in each row
    comm_ptr: np.ndarray    # int64 [communities + 1], first node of each community
    features: np.ndarray    # float32 [n, dim], one C-contiguous array
    labels: np.ndarray      # int64 [n]
    train: np.ndarray       # int64, sorted node ids
    val: np.ndarray
    test: np.ndarray
    classes: int

    @property
    def nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def communities(self) -> int:
        return len(self.comm_ptr) - 1

    @property
    def edges(self) -> int:
        return len(self.indices)

    def community_of(self, nodes: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.comm_ptr, nodes, side="right") - 1

    def homophily(self) -> float:
        """Share of (directed) edges whose endpoints share a community (counted)."""
        return float((self.intra_end - self.indptr[:-1]).sum() / max(1, self.edges))

    def check(self) -> "Graph":
        n = self.nodes
        if n < 2 or self.indptr[0] != 0 or np.any(np.diff(self.indptr) < 0) or self.indptr[-1] != len(self.indices):
            raise GraphError("indptr", "must start at 0, never decrease and end at the number of edges")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= n):
            raise GraphError("indices", f"neighbour ids must lie in [0, {n})")
        if self.comm_ptr[0] != 0 or self.comm_ptr[-1] != n or np.any(np.diff(self.comm_ptr) <= 0):
            raise GraphError("comm_ptr", "communities must be non-empty, contiguous and cover every node")
        if np.any(self.intra_end < self.indptr[:-1]) or np.any(self.intra_end > self.indptr[1:]):
            raise GraphError("intra_end", "must lie inside each row")
        if self.features.ndim != 2 or len(self.features) != n or not self.features.flags.c_contiguous:
            raise GraphError("features", f"must be one C-contiguous [n={n}, dim] array")
        if len(self.labels) != n or self.labels.min() < 0 or self.labels.max() >= self.classes:
            raise GraphError("labels", f"need one class in [0, {self.classes}) per node")
        for name in ("train", "val", "test"):
            ids = getattr(self, name)
            if len(ids) == 0 or ids.min() < 0 or ids.max() >= n:
                raise GraphError(name, "split must be non-empty node ids")
        if len(np.intersect1d(self.train, np.union1d(self.val, self.test))) or len(np.intersect1d(self.val, self.test)):
            raise GraphError("train", "train, val and test splits overlap")
        return self

    def to_npz(self) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **{f.name: getattr(self, f.name) for f in fields(self)})  # uncompressed: features are noise
        return buf.getvalue()

    @classmethod
    def from_npz(cls, blob: bytes) -> "Graph":
        with np.load(io.BytesIO(blob)) as z:
            kw = {f.name: z[f.name] for f in fields(cls)}
        kw["classes"] = int(kw["classes"])
        kw["features"] = np.ascontiguousarray(kw["features"])
        return cls(**kw).check()


def community_sizes(nodes: int, communities: int, rng: np.random.Generator) -> np.ndarray:
    """Sizes uniform in [S/2, 3S/2] around the mean S, adjusted to sum to ``nodes`` (each >= 2)."""
    raw = 0.5 + rng.random(communities)
    sizes = np.maximum(2, np.floor(raw / raw.sum() * nodes).astype(np.int64))
    diff = nodes - int(sizes.sum())
    order = np.argsort(-sizes) if diff < 0 else np.arange(communities)
    i = 0
    while diff != 0:  # at most a few passes: the rounding error is below one node per community
        c = order[i % communities]
        step = 1 if diff > 0 else -1
        if sizes[c] + step >= 2:
            sizes[c] += step
            diff -= step
        i += 1
    return sizes


def sbm_edges(comm_ptr: np.ndarray, avg_degree: float, homophily: float, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray]:
    """Undirected SBM-like edges as a symmetric, deduplicated (src, dst) list without self-loops."""
    n = int(comm_ptr[-1])
    sizes = np.diff(comm_ptr)
    m = int(round(n * avg_degree / 2))
    src = rng.integers(0, n, m, dtype=np.int64)
    comm = np.searchsorted(comm_ptr, src, side="right") - 1
    intra = rng.random(m) < homophily
    dst = np.where(intra, comm_ptr[comm] + (rng.random(m) * sizes[comm]).astype(np.int64),
                   rng.integers(0, n, m, dtype=np.int64))
    keep = src != dst
    src, dst = src[keep], dst[keep]
    return np.concatenate([src, dst]), np.concatenate([dst, src])


def csr(comm_ptr: np.ndarray, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, intra_end): rows sorted with same-community neighbours first, duplicates removed."""
    n = int(comm_ptr[-1])
    cs = np.searchsorted(comm_ptr, src, side="right") - 1
    cd = np.searchsorted(comm_ptr, dst, side="right") - 1
    inter = (cs != cd).astype(np.int64)
    key = np.unique(src * (2 * n) + inter * n + dst)  # sorts by (src, inter, dst) and drops duplicates
    src, rest = np.divmod(key, 2 * n)
    inter, dst = np.divmod(rest, n)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    intra_end = indptr[:-1] + np.bincount(src[inter == 0], minlength=n)
    return indptr, dst.astype(np.int64), intra_end


def generate(*, nodes: int, communities: int, avg_degree: float, homophily: float, feature_dim: int, classes: int,
             label_purity: float, class_signal: float, community_signal: float, noise: float,
             train_fraction: float, val_fraction: float, test_fraction: float, seed: int) -> Graph:
    rng = np.random.default_rng([seed, 20])
    sizes = community_sizes(nodes, communities, rng)
    comm_ptr = np.zeros(communities + 1, np.int64)
    np.cumsum(sizes, out=comm_ptr[1:])
    indptr, indices, intra_end = csr(comm_ptr, *sbm_edges(comm_ptr, avg_degree, homophily, rng))
    comm = np.repeat(np.arange(communities), sizes)
    dominant = rng.integers(0, classes, communities)
    labels = np.where(rng.random(nodes) < label_purity, dominant[comm], rng.integers(0, classes, nodes))
    scale = 1.0 / np.sqrt(feature_dim)  # centroids of unit expected norm
    class_mu = rng.standard_normal((classes, feature_dim), dtype=np.float32) * scale
    comm_mu = rng.standard_normal((communities, feature_dim), dtype=np.float32) * scale
    features = rng.standard_normal((nodes, feature_dim), dtype=np.float32)
    features *= np.float32(noise * scale)
    features += np.float32(class_signal) * class_mu[labels]
    features += np.float32(community_signal) * comm_mu[comm]
    perm = rng.permutation(nodes)
    a, b = int(train_fraction * nodes), int((train_fraction + val_fraction) * nodes)
    c = b + int(test_fraction * nodes)
    return Graph(indptr=indptr, indices=indices, intra_end=intra_end, comm_ptr=comm_ptr,
                 features=np.ascontiguousarray(features), labels=labels.astype(np.int64),
                 train=np.sort(perm[:a]), val=np.sort(perm[a:b]), test=np.sort(perm[b:c]), classes=classes).check()
