"""RecD's InverseKeyedJaggedTensor: per feature the batch's unique lists plus inverse indices.

Samples of one user session carry identical user-feature lists. An IKJT stores each distinct
list once (``unique``) and, per sample, the index of its list (``inverse``). Embedding lookups
and pooling then run on the unique lists only; ``index_select`` expands the pooled rows back
to the batch. The math is the KJT's: row i pools exactly the ids of sample i.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from mlsys_flows.systems.common.dlrm import Jagged, KeyedJaggedTensor, mix64, take_lists


def _first_occurrence_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of each distinct key's first row, inverse) with uniques in first-seen order."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True, axis=0 if keys.ndim > 1 else None)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return first[order], rank[inverse.reshape(-1)]


def _exact_keys(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One row per list, [length, ids..., 0-padding]: equal rows <=> equal lists."""
    width = int(lengths.max(initial=0))
    out = np.zeros((lengths.size, width + 1), dtype=np.int64)
    out[:, 0] = lengths
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    col = np.arange(values.size) - np.repeat(offsets[:-1], lengths)
    out[np.repeat(np.arange(lengths.size), lengths), col + 1] = values
    return out


def dedup_jagged(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact deduplication of a batch of id lists.

    Returns ``(unique_values, unique_lengths, inverse)`` with uniques in first-seen order, so
    that list i equals unique list ``inverse[i]``. A 64-bit content hash per list
    groups candidates; a vectorized comparison against each group's first list proves the
    grouping, and a collision falls back to an exact row-wise unique. The hash is a plain sum
    (one pass): the proof pass makes a stronger one unnecessary.
    """
    values = np.ascontiguousarray(values, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return values[:0], lengths, np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    with np.errstate(over="ignore"):
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(values.view(np.uint64), dtype=np.uint64)])
        h = mix64((prefix[offsets[1:]] - prefix[offsets[:-1]]) ^ (lengths.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    first, inverse = _first_occurrence_order(h)
    rep = first[inverse]  # each list's representative: the first list with the same hash
    shift = offsets[:-1][rep] - offsets[:-1]
    same = np.array_equal(lengths[rep], lengths) and \
        np.array_equal(values[np.arange(values.size) + np.repeat(shift, lengths)], values)
    if not same:  # a hash collision (e.g. lists with equal sums): be exact
        first, inverse = _first_occurrence_order(_exact_keys(values, lengths))
    uniq_values, uniq_lengths = take_lists(values, lengths, first)
    return uniq_values, uniq_lengths, inverse.astype(np.int64)


def dedup_consecutive(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact deduplication of lists equal to their predecessor (same result type as
    :func:`dedup_jagged`). On session-clustered data every duplicate is adjacent, so this finds
    them all with one comparison pass and no hashing: what session clustering buys the reader.
    """
    values = np.ascontiguousarray(values, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    n = lengths.size
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    dup = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(lengths[1:] == lengths[:-1]) + 1  # rows as long as the row before
    for run in np.split(cand, np.flatnonzero(np.diff(cand) != 1) + 1) if cand.size else []:
        a, b, width = int(run[0]), int(run[-1]) + 1, int(lengths[run[0]])
        if width == 0:
            dup[a:b] = True
            continue
        # rows a..b-1 all have `width` values: compare each with the list right before it
        lo, hi = int(offsets[a]), int(offsets[b])
        dup[a:b] = (values[lo:hi] == values[lo - width:hi - width]).reshape(b - a, width).all(axis=1)
    first = np.flatnonzero(~dup)
    uniq_values, uniq_lengths = take_lists(values, lengths, first)
    return uniq_values, uniq_lengths, np.cumsum(~dup) - 1


class InverseKeyedJaggedTensor:
    """key -> (unique lists as :class:`Jagged`, ``inverse`` [batch] into those lists)."""

    def __init__(self, unique: Mapping[str, Jagged], inverse: Mapping[str, torch.Tensor]):
        if list(unique) != list(inverse):
            raise ValueError("IKJT unique and inverse must have the same keys in the same order")
        sizes = {int(i.numel()) for i in inverse.values()}
        if len(sizes) > 1:
            raise ValueError(f"IKJT inverse indices have different batch sizes: {sorted(sizes)}")
        for k, inv in inverse.items():
            if inv.numel() and (int(inv.min()) < 0 or int(inv.max()) >= unique[k].rows):
                raise ValueError(f"IKJT inverse indices of {k!r} point outside its {unique[k].rows} unique lists")
        self.unique, self.inverse = dict(unique), dict(inverse)

    @classmethod
    def from_kjt(cls, kjt: KeyedJaggedTensor, consecutive: bool = False) -> "InverseKeyedJaggedTensor":
        """Deduplicate every feature of ``kjt``: fully, or only adjacent repeats (cheaper)."""
        dedup = dedup_consecutive if consecutive else dedup_jagged
        unique, inverse = {}, {}
        for k in kjt.keys():
            v, l, inv = dedup(kjt[k].values.cpu().numpy(), kjt[k].lengths.cpu().numpy())
            unique[k], inverse[k] = Jagged.from_numpy(v, l), torch.from_numpy(inv)
        return cls(unique, inverse)

    def keys(self) -> list[str]:
        return list(self.unique)

    @property
    def batch_size(self) -> int:
        return next(iter(self.inverse.values())).numel() if self.inverse else 0

    def num_values(self) -> int:
        return sum(j.values.numel() for j in self.unique.values())

    def dedup_factor(self) -> float:
        """Values a KJT of this batch would hold / values held here."""
        full = sum(int(self.unique[k].lengths.index_select(0, self.inverse[k]).sum()) for k in self.keys())
        return full / max(1, self.num_values())

    def to(self, device) -> "InverseKeyedJaggedTensor":
        return InverseKeyedJaggedTensor({k: j.to(device) for k, j in self.unique.items()},
                                        {k: i.to(device, non_blocking=True) for k, i in self.inverse.items()})

    def to_kjt(self) -> KeyedJaggedTensor:
        """The equivalent KJT (every sample's own list), exactly."""
        return KeyedJaggedTensor({k: self.unique[k].take(self.inverse[k]) for k in self.keys()})

    def pool(self, tables: Mapping[str, nn.EmbeddingBag]) -> dict[str, torch.Tensor]:
        """Look up and pool each unique list once, then expand to the batch."""
        return {k: tables[k](u.values, u.offsets()[:-1]).index_select(0, self.inverse[k]) for k, u in self.unique.items()}
