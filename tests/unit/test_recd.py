"""RecD: IKJT round trip and dedup (property tests), same-math training, workload and bad inputs."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.dlrm import DLRM, Jagged, KeyedJaggedTensor, take_lists, take_lists_torch
from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recd import Params
from mlsys_flows.systems.recd import pipeline as pl
from mlsys_flows.systems.recd.ikjt import InverseKeyedJaggedTensor, dedup_consecutive, dedup_jagged
from mlsys_flows.systems.recd.workload import DatasetError, Schema, arrival_order, generate, in_batch_dedup_factor

# a small alphabet of lists so that batches hold many duplicates, adjacent and not
LISTS = st.lists(st.lists(st.integers(-3, 3), max_size=4), min_size=1, max_size=6)
BATCH = st.lists(st.integers(0, 5), max_size=40)


def _kjt(pool: list[list[int]], picks: list[int], extra: list[list[int]] | None = None) -> KeyedJaggedTensor:
    rows = [pool[i % len(pool)] for i in picks]
    feats = {}
    for key, lists in (("a", rows), ("b", extra if extra is not None else rows[::-1])):
        feats[key] = Jagged(torch.tensor([v for r in lists for v in r], dtype=torch.int64),
                            torch.tensor([len(r) for r in lists], dtype=torch.int64))
    return KeyedJaggedTensor(feats)


@settings(max_examples=150, deadline=None)
@given(LISTS, BATCH, st.booleans())
def test_ikjt_to_kjt_round_trips_exactly(pool, picks, consecutive):
    kjt = _kjt(pool, picks)
    ikjt = InverseKeyedJaggedTensor.from_kjt(kjt, consecutive=consecutive)
    assert ikjt.to_kjt().equal(kjt)
    assert ikjt.batch_size == kjt.batch_size
    assert ikjt.num_values() <= kjt.num_values()


@settings(max_examples=150, deadline=None)
@given(LISTS, BATCH)
def test_full_dedup_keeps_each_distinct_list_once(pool, picks):
    rows = [pool[i % len(pool)] for i in picks]
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    uv, ul, inv = dedup_jagged(values, lengths)
    uniq = [list(map(int, uv[o - n:o])) for o, n in zip(np.cumsum(ul), ul)]
    assert len(uniq) == len({tuple(r) for r in rows})            # each distinct list exactly once
    assert [uniq[i] for i in inv] == rows                        # and every row points at its own list
    cv, cl, cinv = dedup_consecutive(values, lengths)            # consecutive: one per run of repeats
    runs = sum(1 for i, r in enumerate(rows) if i == 0 or r != rows[i - 1])
    assert cl.size == runs


def test_equal_sums_fall_back_to_the_exact_path():
    # [1, 2] and [2, 1] (and [0, 3]) share length and sum: the cheap key collides, the proof pass catches it
    values = np.array([1, 2, 2, 1, 0, 3, 1, 2], dtype=np.int64)
    lengths = np.array([2, 2, 2, 2], dtype=np.int64)
    uv, ul, inv = dedup_jagged(values, lengths)
    assert inv.tolist() == [0, 1, 2, 0] and uv.tolist() == [1, 2, 2, 1, 0, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=20), st.lists(st.integers(0, 19), max_size=30))
def test_numpy_and_torch_jagged_take_agree(lengths, rows):
    lengths = np.array(lengths, dtype=np.int64)
    rows = np.array([r % lengths.size for r in rows], dtype=np.int64)
    values = np.arange(int(lengths.sum()), dtype=np.int64) * 7
    nv, nl = take_lists(values, lengths, rows)
    tv, tl = take_lists_torch(torch.from_numpy(values), torch.from_numpy(lengths), torch.from_numpy(rows))
    assert tv.tolist() == nv.tolist() and tl.tolist() == nl.tolist()


def test_ikjt_pooling_equals_kjt_pooling():
    torch.manual_seed(0)
    pool = [[1, 5, 9], [2], [], [7, 7, 3, 1]]
    kjt = _kjt(pool, [0, 0, 0, 1, 1, 2, 3, 3, 0], extra=[[4]] * 9)
    ikjt = InverseKeyedJaggedTensor.from_kjt(KeyedJaggedTensor({"a": kjt["a"]}))
    model = DLRM(3, {"a": 16, "b": 16}, 8, pooling="mean")
    dense = torch.randn(9, 3)
    item = KeyedJaggedTensor({"b": kjt["b"]})
    base = model(dense, [kjt])
    dedup = model(dense, [item, ikjt])
    assert torch.allclose(base, dedup, atol=1e-6)
    assert ikjt.dedup_factor() > 1


def test_trainers_on_kjt_and_ikjt_follow_the_same_loss_curve():
    p = Params.for_scale("smoke")
    table, rg = generate(p), p.batch_size * p.batches_per_row_group
    blob = pl.parquet_bytes(table, rg)
    batches = {"kjt": list(pl.read_batches(pl.parquet_bytes(arrival_order(table, p.seed), rg), p, dedup=False)),
               "kjt_clustered": list(pl.read_batches(blob, p, dedup=False)),
               "ikjt": list(pl.read_batches(blob, p, dedup=True))}
    out = pl.train_interleaved(batches, p)
    kl, il = np.array(out["kjt_clustered"]["losses"]), np.array(out["ikjt"]["losses"])
    al = np.array(out["kjt"]["losses"])
    assert kl.size == al.size == len(batches["kjt"]) and np.all(np.isfinite(kl)) and np.all(np.isfinite(al))
    assert np.max(np.abs(kl - il)) < 1e-4            # same batches, same math
    assert np.max(np.abs(al - kl)) > 1e-3            # arrival order: other batches, another loss curve
    for losses in (kl, al):                          # the hidden model is learnable in either order
        assert pl.final_loss(list(losses)) < losses[0]
    assert sum(b.sparse[1].num_values() for b in batches["ikjt"]) * 3 < \
        sum(b.sparse[1].num_values() for b in batches["kjt_clustered"])


def test_workload_has_sessions_and_clustering_shrinks_storage():
    p = Params.for_scale("smoke")
    table = generate(p)
    sid = table.column("session_id").to_numpy()
    sizes = np.bincount(sid)
    assert sizes.min() >= p.session_min and sizes.max() <= p.session_max and sizes.size == p.sessions
    users = table.column("user_0").to_pylist()
    for s in range(3):  # user lists are constant within a session, and long
        rows = [users[i] for i in np.flatnonzero(sid == s)]
        assert all(r == rows[0] for r in rows) and len(rows[0]) >= p.user_list_len // 2
    arrival = arrival_order(table, p.seed)
    rg = p.batch_size * p.batches_per_row_group
    assert len(pl.parquet_bytes(table, rg)) * 1.3 < len(pl.parquet_bytes(arrival, rg))
    assert in_batch_dedup_factor(table, "user_0", p.batch_size) > 3 * in_batch_dedup_factor(arrival, "user_0", p.batch_size)


def test_bad_parameters_name_the_field():
    for overrides, field in [({"session_min": 0}, "session_min"), ({"sessions": 0}, "sessions"),
                             ({"session_min": 9, "session_max": 4}, "session_max"), ({"batch_size": 10**7}, "batch_size")]:
        with pytest.raises(ParamsError, match=f"'{field}'"):
            Params.for_scale("smoke", **overrides)


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_empty_dataset_or_missing_column_fails_before_any_batch():
    p = Params.for_scale("smoke")
    table = generate(p)
    with pytest.raises(DatasetError, match="empty"):
        next(pl.read_batches(_parquet(table.slice(0, 0)), p, dedup=True))
    with pytest.raises(DatasetError, match="'user_1'"):
        next(pl.read_batches(_parquet(table.drop_columns(["user_1"])), p, dedup=False))
    assert Schema.of(p).user == ("user_0", "user_1")
