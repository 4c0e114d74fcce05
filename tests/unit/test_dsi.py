"""DSI/DPP: projection and coalescing, the master's exactly-once delivery, DPP and the inline trainer
stepping on batches of the same contents (by digest; the check is shown to fail on a changed, dropped
or duplicated batch), the controller, bad inputs."""
from __future__ import annotations

import hashlib
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mlsys_flows.blocks import ObjectStorage
from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.dsi import Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.dpp import Controller, DPPError, Trainer, num_batches, run_dpp, run_inline


@pytest.fixture
def dataset(tmp_path):
    p = Params.for_scale("smoke", step_ms=0.0)
    storage = ObjectStorage(url=(tmp_path / "s").as_uri()).check()
    for i in range(p.files):
        storage.write_bytes(d.file_key("ds", i), d.to_parquet(d.generate_file(p, i), p.rows_per_group))
    items = d.plan(storage.list("ds"), storage.open_input, p.used_columns(), "ds")
    return p, storage, items


class ThreadExecutor:
    """Named fake workers on a thread pool; a 'dead' worker vanishes and its attempts never finish."""

    def __init__(self, storage, p, names=("w0", "w1", "w2"), slow: set[int] = frozenset()):
        self.storage, self.p, self.live = storage, p, list(names)
        self.pool = ThreadPoolExecutor(8)
        self.submitted: list[tuple[int, str]] = []
        self.slow = set(slow)
        self.dead: set[str] = set()

    def workers(self):
        return list(self.live)

    def submit(self, item, worker):
        self.submitted.append((item.id, worker))
        hang = worker in self.dead or (item.id in self.slow and sum(i == item.id for i, _ in self.submitted) == 1)

        def work():
            if hang:
                time.sleep(1.0)  # a lost or straggling attempt
            return d.process_item(item, self.storage.open_input, self.p.used_columns(), self.p, projected=True)

        return self.pool.submit(work)

    def kill(self, worker):
        self.dead.add(worker)
        self.live.remove(worker)


def _exactly_once(consumed, items, p):
    assert len(consumed) == len(set(consumed)) == num_batches(items, p.batch_size)
    assert {i for i, _ in consumed} == {it.id for it in items}


def test_projection_reads_less_in_fewer_calls_and_gives_the_same_batches(dataset):
    p, storage, items = dataset
    full, fs = d.process_item(items[0], storage.open_input, p.used_columns(), p, projected=False)
    proj, ps = d.process_item(items[0], storage.open_input, p.used_columns(), p, projected=True)
    assert ps["bytes_read"] < 0.75 * fs["bytes_read"] and ps["read_calls"] < fs["read_calls"] / 3
    assert len(full) == len(proj) == items[0].rows // p.batch_size
    for a, b in zip(full, proj):
        assert np.array_equal(a.dense, b.dense) and np.array_equal(a.labels, b.labels)
        for c in a.sparse:
            assert all(np.array_equal(x, y) for x, y in zip(a.sparse[c], b.sparse[c]))
    assert np.isfinite(full[0].dense).all()  # missing values were filled


def _digest(b: d.Batch) -> str:
    """SHA-256 of everything a training step sees of a batch: dense features, labels, and each sparse
    column's hashed ids and lengths (with dtypes and shapes)."""
    h = hashlib.sha256()
    arrays = [b.dense, b.labels] + [x for c in sorted(b.sparse) for x in b.sparse[c]]
    names = ["dense", "labels"] + [f"{c}.{part}" for c in sorted(b.sparse) for part in ("ids", "lengths")]
    for name, x in zip(names, arrays):
        x = np.ascontiguousarray(x)
        h.update(f"{name}:{x.dtype.str}:{x.shape};".encode())
        h.update(x.tobytes())
    return h.hexdigest()


def _trained_batches(monkeypatch, run) -> list[tuple[int, int, str]]:
    """(item, index, digest) of every batch the trainer steps on during ``run()``, in step order."""
    seen: list[tuple[int, int, str]] = []
    step = Trainer.step

    def recording_step(self, b):
        seen.append((b.item, b.index, _digest(b)))
        return step(self, b)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", recording_step)
        run()
    return seen


def _check_same_batches(dpp: list[tuple[int, int, str]], inline: list[tuple[int, int, str]], items,
                        batch_size: int) -> None:
    """The inline trainer steps on every batch of every item once, in the items' order; DPP steps on
    batches of the same contents, each once (per (item, index), in any order of items)."""
    in_order = [(it.id, j) for it in items for j in range(math.ceil(it.rows / batch_size))]
    assert [(i, j) for i, j, _ in inline] == in_order
    assert len(dpp) == len(set(dpp)), "DPP trained on a batch twice"
    assert sorted(dpp) == sorted(inline), "DPP's batches differ from the inline trainer's"


def test_dpp_and_inline_train_on_the_same_batches(dataset, monkeypatch):
    p, storage, items = dataset
    out = {}
    used = p.used_columns()
    inline = _trained_batches(monkeypatch, lambda: out.update(inline=run_inline(items, storage.open_input, used, p)))
    dpp = _trained_batches(monkeypatch, lambda: out.update(dpp=run_dpp(items, ThreadExecutor(storage, p), used, p)))
    metrics, details = out["dpp"]
    _exactly_once(details["consumed"], items, p)
    _check_same_batches(dpp, inline, items, p.batch_size)
    assert metrics["samples"] == out["inline"]["samples"] == sum(it.rows for it in items)
    assert metrics["bytes_read"] < out["inline"]["bytes_read"]


def _changed(batches: list[d.Batch], what: str) -> list[d.Batch]:
    """The batches with one deliberate defect."""
    out = list(batches)
    b = out[-1]
    if what == "label_flipped":
        labels = b.labels.copy()
        labels[0] = 1.0 - labels[0]
        out[-1] = d.Batch(b.item, b.index, b.dense, b.sparse, labels)
    elif what == "sparse_id_changed":
        col = sorted(b.sparse)[0]
        ids, lengths = b.sparse[col]
        ids = ids.copy()
        ids[0] += 1
        out[-1] = d.Batch(b.item, b.index, b.dense, {**b.sparse, col: (ids, lengths)}, b.labels)
    elif what == "dense_unfilled":
        dense = b.dense.copy()
        dense[0, 0] = np.nan
        out[-1] = d.Batch(b.item, b.index, dense, b.sparse, b.labels)
    elif what == "batch_dropped":
        out.pop()
    elif what == "batch_duplicated":
        out.append(b)
    return out


@pytest.mark.parametrize("what", ["label_flipped", "sparse_id_changed", "dense_unfilled", "batch_dropped",
                                  "batch_duplicated"])
def test_the_same_batches_check_fails_on_a_changed_batch(dataset, what):
    p, storage, items = dataset
    batches = [b for it in items[:2]
               for b in d.process_item(it, storage.open_input, p.used_columns(), p, projected=True)[0]]
    assert batches[-1].sparse and len(batches[-1].labels)
    inline = [(b.item, b.index, _digest(b)) for b in batches]
    _check_same_batches(inline[::-1], inline, items[:2], p.batch_size)  # another delivery order is fine
    broken = [(b.item, b.index, _digest(b)) for b in _changed(batches, what)]
    with pytest.raises(AssertionError):
        _check_same_batches(broken[::-1], inline, items[:2], p.batch_size)


def test_a_dead_workers_items_are_reissued_and_delivered_exactly_once(dataset):
    p, storage, items = dataset
    ex = ThreadExecutor(storage, p)
    ex.dead.add("w0")  # w0's attempts hang like a killed process; then it leaves the cluster
    threading.Timer(0.3, lambda: ex.live.remove("w0")).start()
    p = p.model_copy(update={"start_workers": 3, "max_workers": 3})
    metrics, details = run_dpp(items, ex, p.used_columns(), p)
    _exactly_once(details["consumed"], items, p)
    assert metrics["reissued_items"] >= 1
    assert any(w == "w0" for _, w in ex.submitted)


def test_an_expired_lease_races_a_copy_and_the_late_duplicate_is_dropped(dataset):
    p, storage, items = dataset
    p = p.model_copy(update={"lease_s": 0.2, "start_workers": 2, "max_workers": 2})
    ex = ThreadExecutor(storage, p, slow={items[0].id})
    metrics, details = run_dpp(items, ex, p.used_columns(), p)
    _exactly_once(details["consumed"], items, p)
    assert sum(i == items[0].id for i, _ in ex.submitted) == 2
    time.sleep(1.2)  # let the straggler finish: delivery already happened, nothing more arrives


def test_an_item_failing_every_attempt_stops_the_run(dataset):
    p, storage, items = dataset

    class Broken(ThreadExecutor):
        def submit(self, item, worker):
            return self.pool.submit(lambda: (_ for _ in ()).throw(OSError("disk gone")))

    with pytest.raises(DPPError, match="failed"):
        run_dpp(items, Broken(storage, p), p.used_columns(), p.model_copy(update={"max_attempts": 2}))


def test_controller_scales_on_stall_within_limits():
    p = Params.for_scale("smoke", min_workers=1, start_workers=1, max_workers=3)
    c = Controller(p)
    assert [c.decide(t, 0.5, 0.0, live=8) for t in range(4)] == [2, 3, 3, 3]   # capped by max_workers
    assert c.decide(5, 0.5, 0.0, live=2) == 2                                    # capped by live workers
    assert [c.decide(t, 0.0, 1.0, live=8) for t in range(3)] == [1, 1, 1]       # idle with a full queue
    assert c.decide(9, 0.0, 0.1, live=8) == 1


def test_empty_dataset_and_missing_column_fail_before_training(dataset, tmp_path):
    p, storage, _ = dataset
    with pytest.raises(d.DatasetError, match="empty dataset"):
        d.plan([], storage.open_input, p.used_columns(), "nowhere")
    with pytest.raises(d.DatasetError, match="'dense_99'"):
        d.plan(storage.list("ds"), storage.open_input, ["dense_0", "dense_99"], "ds")
    empty = d.generate_file(p, 0).slice(0, 0)
    storage.write_bytes("empty/part.parquet", d.to_parquet(empty, 16))
    with pytest.raises(d.DatasetError, match="no rows"):
        d.plan(storage.list("empty"), storage.open_input, p.used_columns(), "empty")


def test_bad_parameters_name_the_field():
    for overrides, field in [({"used_dense": 99}, "used_dense"), ({"features": ["dense_0", "nope"]}, "features"),
                             ({"features": ["sparse_0"]}, "features"), ({"start_workers": 5, "max_workers": 2}, "start_workers"),
                             ({"stall_low": 0.9}, "stall_low"), ({"files": 0}, "files"), ({"rows_per_group": 10**9}, "rows_per_group")]:
        with pytest.raises(ParamsError, match=f"'{field}'"):
            Params.for_scale("smoke", **overrides)
    assert Params.for_scale("smoke", dataset="elsewhere", features=["dense_0", "x"]).used_columns() == ["dense_0", "x"]
