"""RecShard's inputs: a heterogeneous set of embedding tables (Criteo/production-like: rows spanning
orders of magnitude, pooling factors 1..~30, row coverage 0.2..1, dims 16..128), a TRAINING trace that
is profiled, and a HELD-OUT trace (another seed) that plans are replayed against.

The profile keeps, per table, the access count of every row in the training trace: sorted, these give
the access CDF over rows (the share of accesses the hottest k rows take), the pooling factor
(lookups per sample) and the coverage (rows touched at all). Every random draw of table ``j`` uses its
own generator seeded by (seed, stream, j), so any split of the tables over tasks gives the same trace.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from mlsys_flows.systems.common.embeddings import Table, make_table, sample_ids

SPECS, TABLES, TRAIN, HELD_OUT = 0, 1, 2, 3  # random streams


def rng(seed: int, stream: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, *more])


@dataclass(frozen=True)
class TableSpec:
    rows: np.ndarray      # int64 [T]
    dim: np.ndarray       # int64 [T]
    pooling: np.ndarray   # float64 [T] mean ids per sample
    coverage: np.ndarray  # float64 [T] share of rows hashing can reach


def table_specs(num_tables: int, rows_min: int, rows_max: int, dims: list[int], pooling_max: float,
                coverage_min: float, seed: int) -> TableSpec:
    """Log-uniform rows and pooling (a few huge tables, many small ones; most features look up one or a
    few ids, some tens), dims drawn from ``dims``, coverage uniform in [coverage_min, 1]."""
    g = rng(seed, SPECS)
    rows = np.exp(g.uniform(np.log(rows_min), np.log(rows_max), num_tables)).round().astype(np.int64)
    dim = g.choice(np.asarray(dims, np.int64), num_tables)
    pooling = np.exp(g.uniform(0.0, np.log(pooling_max), num_tables))
    coverage = g.uniform(coverage_min, 1.0, num_tables)
    return TableSpec(rows, dim, pooling, coverage)


def build_table(spec: TableSpec, j: int, seed: int, hot_fraction: float, hot_share: float) -> Table:
    t = make_table(f"t{j}", int(spec.rows[j]), int(spec.dim[j]), float(spec.pooling[j]), float(spec.coverage[j]),
                   rng(seed, TABLES, j), hot_fraction, hot_share)
    # stored as float32 (tables_to_npz): both traces sample from exactly the stored probabilities
    return Table(t.name, t.rows, t.dim, t.pooling, t.probs.astype(np.float32).astype(np.float64))


def trace(table: Table, j: int, samples: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """Table ``j``'s lookups of ``samples`` consecutive samples of the TRAIN or HELD_OUT trace."""
    return sample_ids(table, samples, rng(seed, stream, j))


def trace_prefix(table: Table, j: int, samples: int, first: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``first`` samples of ``trace(table, j, samples, seed, stream)``, without drawing the rest
    of its ids: the same draws as ``sample_ids`` (every length, then one uniform per id; a generator's
    uniforms are a prefix of a longer draw's), checked against ``trace`` by a unit test."""
    g = rng(seed, stream, j)
    lengths = np.maximum(1, g.poisson(table.pooling, size=samples)).astype(np.int64)[:first]
    cdf = np.cumsum(table.probs)
    ids = np.searchsorted(cdf, g.random(int(lengths.sum())) * cdf[-1], side="right")
    return np.minimum(ids, table.rows - 1).astype(np.int64), lengths


@dataclass(frozen=True)
class Profile:
    """What RecShard learns from the training trace, per table: ``counts[j]`` (accesses of each row)."""

    dim: np.ndarray        # int64 [T]
    samples: int           # samples in the training trace
    counts: list[np.ndarray]

    @property
    def num_tables(self) -> int:
        return len(self.counts)

    @property
    def rows(self) -> np.ndarray:
        return np.array([len(c) for c in self.counts], np.int64)

    @property
    def row_bytes(self) -> np.ndarray:
        return 4 * self.dim  # fp32 rows

    @property
    def lookups_per_sample(self) -> np.ndarray:
        """The pooling factor as measured (the mean ids per sample)."""
        return np.array([c.sum() for c in self.counts], float) / self.samples

    @property
    def touched(self) -> np.ndarray:
        """Rows accessed at least once: the measured coverage times the rows."""
        return np.array([np.count_nonzero(c) for c in self.counts], np.int64)

    def order(self, j: int) -> np.ndarray:
        """Rows of table j hottest first (ties by row id, so the order is deterministic)."""
        return np.argsort(-self.counts[j], kind="stable")

    def rank(self, j: int) -> np.ndarray:
        """rank[row]: the row's position in the hotness order (0 = hottest)."""
        r = np.empty(len(self.counts[j]), np.int64)
        r[self.order(j)] = np.arange(len(r))
        return r

    def cdf(self, j: int) -> np.ndarray:
        """cdf[k] = share of table j's training accesses taken by its k hottest rows (cdf[0] = 0)."""
        c = np.sort(self.counts[j])[::-1].astype(float)
        total = c.sum()
        return np.concatenate([[0.0], np.cumsum(c) / total]) if total else np.zeros(len(c) + 1)

    def hbm_share(self, j: int, hot_rows: int) -> float:
        """Share of table j's training accesses that hit its ``hot_rows`` hottest rows."""
        return float(self.cdf(j)[min(int(hot_rows), len(self.counts[j]))])

    def to_npz(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, dim=self.dim, samples=np.int64(self.samples),
                            **{f"c{j}": c for j, c in enumerate(self.counts)})
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes) -> "Profile":
        z = np.load(io.BytesIO(data))
        dim = z["dim"]
        return cls(dim=dim, samples=int(z["samples"]), counts=[z[f"c{j}"] for j in range(len(dim))])


def profile_table(table: Table, j: int, samples: int, seed: int) -> np.ndarray:
    """Per-row access counts of table j in the training trace."""
    ids, _ = trace(table, j, samples, seed, TRAIN)
    return np.bincount(ids, minlength=table.rows).astype(np.int32)


def tables_to_npz(tables: list[Table]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{f"p{j}": t.probs.astype(np.float32) for j, t in enumerate(tables)},
                        dim=np.array([t.dim for t in tables]), pooling=np.array([t.pooling for t in tables]))
    return buf.getvalue()


def tables_from_npz(data: bytes, only: list[int] | None = None) -> dict[int, Table]:
    z = np.load(io.BytesIO(data))
    dim, pooling = z["dim"], z["pooling"]
    which = range(len(dim)) if only is None else only
    out = {}
    for j in which:
        probs = z[f"p{j}"].astype(np.float64)
        out[j] = Table(f"t{j}", len(probs), int(dim[j]), float(pooling[j]), probs)
    return out
