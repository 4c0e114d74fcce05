"""Synthetic session-structured interaction logs, RecD's workload.

A session is one user viewing ``session_min..session_max`` items. Every sample of a session
carries the same user features (long id lists: the user's history) and the same user-level
dense features; item features (short id lists) and item-level dense features vary per sample.
Ids follow a skewed (power-law) popularity. Labels come from a hidden logistic model of the
features, so the training loss can fall.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from mlsys_flows.errors import MlsysError
from mlsys_flows.systems.common.dlrm import Jagged, mix64

from . import Params, mean_user_len, mix_lengths, user_len_range


@dataclass(frozen=True)
class Schema:
    dense: tuple[str, ...]
    user: tuple[str, ...]
    item: tuple[str, ...]
    label: str = "label"
    session: str = "session_id"

    @classmethod
    def of(cls, p: Params) -> "Schema":
        return cls(tuple(f"dense_{i}" for i in range(p.dense_features)),
                   tuple(f"user_{i}" for i in range(p.user_features)),
                   tuple(f"item_{i}" for i in range(p.item_features)))

    @property
    def sparse(self) -> tuple[str, ...]:
        return self.user + self.item

    @property
    def columns(self) -> list[str]:
        return [self.session, self.label, *self.dense, *self.sparse]


class DatasetError(MlsysError, ValueError):
    """A dataset cannot be used; the message names the file and the column or problem."""


def check_dataset(schema_names: list[str], num_rows: int, schema: Schema, where: str) -> None:
    """Fail before any training if the dataset is empty or lacks a column the model needs."""
    if num_rows == 0:
        raise DatasetError(f"{where}: the dataset is empty (0 rows)")
    missing = [c for c in [schema.label, *schema.dense, *schema.sparse] if c not in schema_names]
    if missing:
        raise DatasetError(f"{where}: missing column {missing[0]!r} (have {', '.join(schema_names)})")


def _raw_ids(rng: np.random.Generator, n: int, vocab: int, salt: int) -> np.ndarray:
    """Skewed categorical ids as opaque 48-bit integers (what logs hold before hashing)."""
    rank = (vocab * rng.random(n) ** 3).astype(np.int64)  # power law: low ranks are popular
    with np.errstate(over="ignore"):
        return (mix64(rank.view(np.uint64) + np.uint64(salt)) >> np.uint64(16)).astype(np.int64)


def _hidden_weight(ids: np.ndarray, salt: int) -> np.ndarray:
    """The hidden model's weight of each id: a deterministic pseudo-random value in [-1, 1)."""
    with np.errstate(over="ignore"):
        u = mix64(ids.view(np.uint64) ^ np.uint64(salt)) >> np.uint64(11)
    return u.astype(np.float64) / 2.0 ** 52 - 1.0


def _list_mean(weights: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return (prefix[offsets[1:]] - prefix[offsets[:-1]]) / np.maximum(lengths, 1)


def _list_array(j: Jagged) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(j.offsets().numpy()), pa.array(j.values.numpy()))


def generate(p: Params) -> pa.Table:
    """The interaction log in session order (samples of a session are contiguous)."""
    return _draw(p, p.sessions)[0]


def generate_split(p: Params) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """(training log, held-out log, the generator's label probability of each held-out sample): one
    draw of ``sessions + heldout_sessions`` sessions from the generator (one hidden model, one seed),
    the first ``sessions`` for training and the rest held out, so no held-out sample (nor session)
    is ever trained on; fixed per seed. Both in session order."""
    table, prob = _draw(p, p.sessions + p.heldout_sessions)
    ids = table.column(Schema.of(p).session).to_numpy()
    n_train = int(np.searchsorted(ids, p.sessions))  # sessions are contiguous and numbered in order
    return table.slice(0, n_train), table.slice(n_train), prob[n_train:]


def logloss(labels: np.ndarray, prob: np.ndarray) -> float:
    """Mean binary logloss of probabilities ``prob`` on ``labels`` (0/1)."""
    q = np.clip(np.asarray(prob, dtype=np.float64), 1e-12, 1 - 1e-12)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))


def _draw(p: Params, sessions: int) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(p.seed)
    schema = Schema.of(p)
    slen = rng.integers(p.session_min, p.session_max + 1, sessions)
    n = int(slen.sum())
    session_of = torch.from_numpy(np.repeat(np.arange(sessions), slen))
    vocab = 4 * p.table_rows
    cols: dict[str, pa.Array] = {schema.session: pa.array(session_of.numpy())}
    score = np.zeros(n)

    half = (p.dense_features + 1) // 2
    dense = np.empty((n, p.dense_features), dtype=np.float32)
    dense[:, :half] = rng.lognormal(0.0, 1.0, (sessions, half))[session_of.numpy()]  # user-level
    dense[:, half:] = rng.lognormal(0.0, 1.0, (n, p.dense_features - half))              # item-level
    w_dense = rng.normal(0.0, 1.0, p.dense_features) / np.sqrt(p.dense_features)
    logd = np.log1p(dense)
    score += ((logd - logd.mean(0)) / (logd.std(0) + 1e-6)) @ w_dense
    for i, name in enumerate(schema.dense):
        cols[name] = pa.array(dense[:, i])

    for f, name in enumerate(schema.user):
        lo, hi = user_len_range(p.user_list_len)
        lengths = rng.integers(lo, hi + 1, sessions)
        per_session = Jagged.from_numpy(_raw_ids(rng, int(lengths.sum()), vocab, 1000 + f), lengths)
        score += 1.5 * (_list_mean(_hidden_weight(per_session.values.numpy(), f), lengths) * np.sqrt(lengths))[session_of.numpy()]
        cols[name] = _list_array(per_session.take(session_of))  # the same list for every sample of a session
    for f, name in enumerate(schema.item):
        lengths = rng.integers(1, 2 * p.item_list_len, n)
        j = Jagged.from_numpy(_raw_ids(rng, int(lengths.sum()), vocab, 2000 + f), lengths)
        score += 1.5 * _list_mean(_hidden_weight(j.values.numpy(), 100 + f), lengths) * np.sqrt(lengths)
        cols[name] = _list_array(j)

    prob = 1.0 / (1.0 + np.exp(-(score - score.mean())))
    cols[schema.label] = pa.array((rng.random(n) < prob).astype(np.float32))
    return pa.table({c: cols[c] for c in schema.columns}), prob


def arrival_order(table: pa.Table, seed: int) -> pa.Table:
    """The same samples as they arrive in a log: concurrent sessions interleave at random."""
    perm = np.random.default_rng(seed + 1).permutation(table.num_rows)
    return table.take(pa.array(perm))


def in_batch_dedup_factor(table: pa.Table, column: str, batch_size: int) -> float:
    """Values of ``column`` / values left after deduplicating lists within each batch."""
    from .ikjt import dedup_jagged

    total = kept = 0
    for start in range(0, table.num_rows, batch_size):
        col = table.column(column).slice(start, batch_size).combine_chunks()
        values, lengths = col.flatten().to_numpy(), np.diff(col.offsets.to_numpy())
        total += values.size
        kept += dedup_jagged(values, lengths)[0].size
    return total / max(1, kept)


# ----- the user/item lookup mix --------------------------------------------------------------------
def ids_per_sample(p: Params) -> float:
    """Expected sparse ids of one sample: every user and item id a KJT trainer looks up."""
    return p.user_features * mean_user_len(p.user_list_len) + p.item_features * p.item_list_len


def expected_user_share(p: Params) -> float:
    """Expected user-feature ids / all sparse ids of a sample (the lookup mix of ``p``)."""
    user = p.user_features * mean_user_len(p.user_list_len)
    return user / (user + p.item_features * p.item_list_len)


def at_mix(p: Params, share: float, samples: int | None = None) -> Params:
    """``p`` with the list lengths changed so that ``share`` of the sparse ids are user-feature ids,
    the ids per sample held at ``p``'s (so a KJT trainer's lookup volume stays the same) and, with
    ``samples``, enough sessions for that many samples. Lengths are integers: the share is met to
    within rounding (``expected_user_share`` of the result says how closely)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"a user share lies strictly between 0 and 1 (got {share})")
    user_len, item_len = mix_lengths(p.user_features, p.user_list_len, p.item_features, p.item_list_len, share)
    changes: dict = {"user_list_len": user_len, "item_list_len": item_len}
    if samples is not None:
        changes["sessions"] = max(1, -(-samples // p.session_min))  # every session has >= session_min samples
    return type(p).model_validate({**p.model_dump(), **changes})


def user_id_share(table: pa.Table, schema: Schema) -> float:
    """Counted: user-feature ids / all sparse ids in ``table``."""
    user = sum(len(table.column(c).combine_chunks().flatten()) for c in schema.user)
    item = sum(len(table.column(c).combine_chunks().flatten()) for c in schema.item)
    return user / max(1, user + item)
