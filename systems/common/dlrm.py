"""Generic DLRM building blocks shared by the recommendation systems (pure torch).

- :class:`Jagged` / :class:`KeyedJaggedTensor`: per sparse feature a batch of id lists as
  ``values`` + ``lengths`` (TorchRec's KJT layout, one entry per key).
- :class:`DLRM` (Naumov et al. 2019): one ``EmbeddingBag`` (sum pooling) per sparse feature, a
  bottom MLP on the dense features, pairwise dot interaction, a top MLP giving one logit.
  Sparse inputs are any objects with ``pool(tables) -> {key: [B, dim]}``, so a technique can
  change how lookups are done (e.g. RecD's deduplicated IKJT) without touching the model.
- :func:`sigrid_hash`: the id -> table-row hash transform of DLRM preprocessing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Jagged:
    """A batch of variable-length id lists: row i is ``values[offsets[i]:offsets[i+1]]``."""

    values: torch.Tensor   # int64 [sum(lengths)]
    lengths: torch.Tensor  # int64 [rows]

    def __post_init__(self):
        if self.values.dim() != 1 or self.lengths.dim() != 1:
            raise ValueError("Jagged values and lengths must be 1-D")
        if int(self.lengths.sum()) != self.values.numel():
            raise ValueError(f"Jagged lengths sum to {int(self.lengths.sum())} but there are {self.values.numel()} values")

    @property
    def rows(self) -> int:
        return self.lengths.numel()

    def offsets(self) -> torch.Tensor:
        """Exclusive prefix sums, ``rows + 1`` entries."""
        return torch.cat([self.lengths.new_zeros(1), torch.cumsum(self.lengths, 0)])

    def take(self, rows: torch.Tensor) -> "Jagged":
        """The lists at ``rows`` (any order, repeats allowed), as a new Jagged."""
        if self.values.device.type == "cpu":  # numpy's repeat is far faster than torch's on CPU
            v, l = take_lists(self.values.numpy(), self.lengths.numpy(), rows.numpy())
            return Jagged(torch.from_numpy(v), torch.from_numpy(l))
        return Jagged(*take_lists_torch(self.values, self.lengths, rows))

    def to(self, device) -> "Jagged":
        return Jagged(self.values.to(device, non_blocking=True), self.lengths.to(device, non_blocking=True))

    def equal(self, other: "Jagged") -> bool:
        return torch.equal(self.lengths, other.lengths) and torch.equal(self.values, other.values)

    @classmethod
    def from_numpy(cls, values: np.ndarray, lengths: np.ndarray) -> "Jagged":
        return cls(torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)),
                   torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)))


class SparseFeatures(Protocol):
    def keys(self) -> list[str]: ...
    def pool(self, tables: Mapping[str, nn.EmbeddingBag]) -> dict[str, torch.Tensor]: ...


class KeyedJaggedTensor:
    """Sparse features of one batch: key -> :class:`Jagged`, all with the same number of rows."""

    def __init__(self, features: Mapping[str, Jagged]):
        self.features = dict(features)
        rows = {j.rows for j in self.features.values()}
        if len(rows) > 1:
            raise ValueError(f"KeyedJaggedTensor features have different batch sizes: {sorted(rows)}")

    def keys(self) -> list[str]:
        return list(self.features)

    @property
    def batch_size(self) -> int:
        return next(iter(self.features.values())).rows if self.features else 0

    def __getitem__(self, key: str) -> Jagged:
        return self.features[key]

    def num_values(self) -> int:
        return sum(j.values.numel() for j in self.features.values())

    def to(self, device) -> "KeyedJaggedTensor":
        return KeyedJaggedTensor({k: j.to(device) for k, j in self.features.items()})

    def pool(self, tables: Mapping[str, nn.EmbeddingBag]) -> dict[str, torch.Tensor]:
        """One sum-pooled embedding per row and key: a lookup for every id of every row."""
        return {k: tables[k](j.values, j.offsets()[:-1]) for k, j in self.features.items()}

    def equal(self, other: "KeyedJaggedTensor") -> bool:
        return self.keys() == other.keys() and all(self[k].equal(other[k]) for k in self.keys())


def take_lists(values: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numpy: the lists ``rows`` of a jagged array given as (values, lengths)."""
    starts = np.concatenate([[0], np.cumsum(lengths)])[rows]
    out_lengths = lengths[rows]
    out_starts = np.cumsum(out_lengths) - out_lengths
    idx = np.arange(int(out_lengths.sum())) + np.repeat(starts - out_starts, out_lengths)
    return values[idx], out_lengths


def take_lists_torch(values: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch (any device, no host sync but one): the lists ``rows`` of (values, lengths)."""
    out_lengths = lengths.index_select(0, rows)
    out_ends = torch.cumsum(out_lengths, 0)
    total = int(out_ends[-1]) if rows.numel() else 0
    seg = torch.searchsorted(out_ends, torch.arange(total, device=values.device), right=True)
    starts = (torch.cumsum(lengths, 0) - lengths).index_select(0, rows)
    shift = starts - (out_ends - out_lengths)
    return values.index_select(0, torch.arange(total, device=values.device) + shift[seg]), out_lengths


def mlp(sizes: Sequence[int], last_relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP + one EmbeddingBag per sparse feature + dot interaction + top MLP -> logit.

    ``pooling`` is the bags' mode: "sum" (DLRM's default) or "mean" (steadier for long lists)."""

    def __init__(self, dense_in: int, tables: Mapping[str, int], dim: int,
                 bottom: Sequence[int] = (64,), top: Sequence[int] = (128, 64), pooling: str = "sum"):
        super().__init__()
        self.keys = list(tables)
        self.bottom = mlp([dense_in, *bottom, dim])
        # sparse=True: gradients touch only looked-up rows, as in production DLRM training.
        self.tables = nn.ModuleDict({k: nn.EmbeddingBag(rows, dim, mode=pooling, sparse=True) for k, rows in tables.items()})
        for k, rows in tables.items():
            bound = rows ** -0.5  # the DLRM reference init keeps long sum-pooled lists small
            nn.init.uniform_(self.tables[k].weight, -bound, bound)
        n = 1 + len(self.keys)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("_li", li, persistent=False)
        self.register_buffer("_lj", lj, persistent=False)
        self.top = mlp([dim + li.numel(), *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: Iterable[SparseFeatures]) -> torch.Tensor:
        x = self.bottom(dense)
        pooled: dict[str, torch.Tensor] = {}
        for s in sparse:
            pooled.update(s.pool(self.tables))
        missing = [k for k in self.keys if k not in pooled]
        if missing:
            raise KeyError(f"DLRM batch lacks sparse features {missing}")
        feats = torch.stack([x, *(pooled[k] for k in self.keys)], dim=1)  # [B, 1 + tables, dim]
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self._li, self._lj]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def feature_salt(name: str) -> int:
    """A stable per-feature hash salt (Python's str hash changes between processes)."""
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little") ^ (len(name) * 0x9E3779B97F4A7C15 & (2**64 - 1))


def sigrid_hash(ids: np.ndarray, salt: int, rows: int) -> np.ndarray:
    """Map raw categorical ids to table rows ``[0, rows)`` with a salted 64-bit hash."""
    with np.errstate(over="ignore"):
        mixed = mix64(ids.astype(np.uint64, copy=False) ^ np.uint64(salt & 0xFFFFFFFFFFFFFFFF))
    return (mixed % np.uint64(rows)).astype(np.int64)
