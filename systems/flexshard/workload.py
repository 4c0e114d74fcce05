"""Sequence-feature lookups for FlexShard: a training trace (only its per-row counts are kept, to
estimate access probabilities) and a held-out trace (every lookup, in chunks of iterations).

All tables are indexed by one global row id (table t's rows follow table t-1's). A trace chunk holds
``ids`` (int64, global rows) ordered by (iteration, table, device) and ``counts[iteration, table,
device]``, the number of lookups of each group: device d's batch is samples d*B..(d+1)*B-1 of one
draw of ``devices * B`` samples per table and iteration.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from mlsys_flows.systems.common.embeddings import Table, make_table, sample_ids

# independent random streams: (seed, stream[, chunk])
_TABLES, _TRAIN, _HELDOUT = 0, 1, 2


@dataclass(frozen=True)
class Workload:
    """The tables (true popularity, used only to draw lookups) and the training counts."""

    tables: list[Table]
    train_counts: np.ndarray  # int64 [total rows]: lookups of each row in the training trace
    train_iterations: int
    devices: int
    batch_per_device: int

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([t.rows for t in self.tables])]).astype(np.int64)

    @property
    def total_rows(self) -> int:
        return int(self.offsets[-1])

    def to_npz(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, probs=np.concatenate([t.probs for t in self.tables]), offsets=self.offsets,
                            dims=np.array([t.dim for t in self.tables]), pooling=np.array([t.pooling for t in self.tables]),
                            train_counts=self.train_counts,
                            shape=np.array([self.train_iterations, self.devices, self.batch_per_device]))
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes) -> "Workload":
        z = np.load(io.BytesIO(data))
        off, probs = z["offsets"], z["probs"]
        tables = [Table(f"seq_{i}", int(off[i + 1] - off[i]), int(z["dims"][i]), float(z["pooling"][i]),
                        probs[off[i]:off[i + 1]]) for i in range(len(off) - 1)]
        it, dev, b = (int(v) for v in z["shape"])
        return cls(tables, z["train_counts"], it, dev, b)


def _draw(tables: list[Table], devices: int, batch: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """One iteration: per table, the global ids of all devices' lookups and counts[table, device]."""
    ids, counts, offset = [], np.zeros((len(tables), devices), np.int64), 0
    for t, table in enumerate(tables):
        tid, lengths = sample_ids(table, devices * batch, rng)  # one draw for all devices: one CDF build
        ids.append(tid + offset)
        counts[t] = lengths.reshape(devices, batch).sum(axis=1)
        offset += table.rows
    return ids, counts


def make_workload(tables: int, rows: int, dim: int, seq_len: int, coverage: float, devices: int,
                  batch_per_device: int, train_iterations: int, seed: int) -> Workload:
    """Sequence tables (pooling = sequence length) and the access counts of a training trace."""
    rng = np.random.default_rng([seed, _TABLES])
    tabs = [make_table(f"seq_{i}", rows, dim, float(seq_len), coverage, rng) for i in range(tables)]
    counts = np.zeros(sum(t.rows for t in tabs), np.int64)
    rng = np.random.default_rng([seed, _TRAIN])
    for _ in range(train_iterations):
        ids, _ = _draw(tabs, devices, batch_per_device, rng)
        for x in ids:
            counts += np.bincount(x, minlength=len(counts))
    return Workload(tabs, counts, train_iterations, devices, batch_per_device)


def heldout_chunk(w: Workload, iterations: int, chunk: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``iterations`` held-out iterations (a stream of its own per chunk, never the training one):
    (ids, counts[iteration, table, device])."""
    rng = np.random.default_rng([seed, _HELDOUT, chunk])
    ids, counts = [], np.zeros((iterations, len(w.tables), w.devices), np.int64)
    for i in range(iterations):
        x, counts[i] = _draw(w.tables, w.devices, w.batch_per_device, rng)
        ids += x
    return np.concatenate(ids), counts


def chunk_to_npz(ids: np.ndarray, counts: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, ids=ids, counts=counts)
    return buf.getvalue()


def chunk_from_npz(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(io.BytesIO(data))
    return z["ids"], z["counts"]
