"""DSI/DPP: projection and coalescing, the master's exactly-once delivery, DPP and both on-trainer
loaders (projected, full rows) stepping on batches of the same contents (by digest; the check is shown
to fail on a changed, dropped or duplicated batch), the prefetching loader overlapping loads with steps
(by event order; the check fails on a serial log), pinning restoring the affinity, the CPU trainer
step, the controller, bad inputs."""
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
from mlsys_flows.systems.dsi.cpu import HAS_AFFINITY, available_cores, pinned, split_cores
from mlsys_flows.systems.dsi.dpp import (Controller, DPPError, PrefetchLoader, Trainer, calibrate_passes,
                                         num_batches, run_dpp, run_inline)


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


@pytest.mark.parametrize("loader_threads", [1, 3])
def test_dpp_and_both_inline_loaders_train_on_the_same_batches(dataset, monkeypatch, loader_threads):
    p, storage, items = dataset
    p = p.model_copy(update={"loader_threads": loader_threads})
    out = {}
    used = p.used_columns()
    inline = _trained_batches(monkeypatch, lambda: out.update(inline=run_inline(items, storage.open_input, used, p)))
    full = _trained_batches(monkeypatch, lambda: out.update(full=run_inline(items, storage.open_input, used, p,
                                                                            projected=False)))
    dpp = _trained_batches(monkeypatch, lambda: out.update(dpp=run_dpp(items, ThreadExecutor(storage, p), used, p)))
    metrics, details = out["dpp"]
    _exactly_once(details["consumed"], items, p)
    _check_same_batches(dpp, inline, items, p.batch_size)
    _check_same_batches(full, inline, items, p.batch_size)
    assert [(i, j) for i, j, _ in full] == [(i, j) for i, j, _ in inline]  # both loaders deliver in order
    assert metrics["samples"] == out["inline"]["samples"] == out["full"]["samples"] == sum(it.rows for it in items)
    assert metrics["bytes_read"] < out["full"]["bytes_read"] and out["inline"]["bytes_read"] < out["full"]["bytes_read"]
    assert metrics["read_calls"] < out["full"]["read_calls"]
    for m in (metrics, out["inline"], out["full"]):
        assert 0 <= m["stall_fraction"] <= 1 and math.isfinite(m["final_loss"])


def _overlap_violations(events: list[tuple[str, int]], n: int, window: int) -> list[str]:
    """What keeps an event log (("load_start"|"load_end"|"consume_start"|"consume_end", item)) from
    showing a prefetching loader: items consumed out of order or not once each, item k+1's load not
    started before item k's consumption ended (no overlap), or more than ``window`` items loading
    ahead of the trainer."""
    pos = {}
    for i, e in enumerate(events):
        pos.setdefault(e, i)
    bad = []
    if [k for e, k in events if e == "consume_start"] != list(range(n)):
        bad.append("not consumed in order, once each")
    for k in range(n - 1):
        if not pos.get(("load_start", k + 1), len(events)) < pos.get(("consume_end", k), -1):
            bad.append(f"item {k + 1} loaded only after item {k} was consumed")
    for k in range(n):
        started = sum(1 for e, j in events[:pos.get(("consume_start", k), 0)] if e == "load_start")
        if started > k + 1 + window:
            bad.append(f"{started} loads started before item {k} was consumed")
    return bad


def _loader_events(threads: int, ahead: int, n: int = 8, load_s: float = 0.03, step_s: float = 0.05):
    items = [d.WorkItem(i, "k", i, 10) for i in range(n)]
    events: list[tuple[str, int]] = []
    lock = threading.Lock()

    def log(what, k):
        with lock:
            events.append((what, k))

    def load(it):
        log("load_start", it.id)
        time.sleep(load_s)
        log("load_end", it.id)
        return [it.id], {}

    for fut in PrefetchLoader(items, load, threads, ahead):
        (k,), _ = fut.result()
        log("consume_start", k)
        time.sleep(step_s)
        log("consume_end", k)
    return events


@pytest.mark.parametrize("threads,ahead", [(1, 1), (1, 2), (3, 2)])
def test_the_prefetching_loader_overlaps_loads_with_steps_in_order(threads, ahead):
    events = _loader_events(threads, ahead)
    assert _overlap_violations(events, 8, threads * ahead) == []


def test_the_overlap_check_fails_on_a_serial_or_reordered_loader():
    serial = [(e, k) for k in range(8) for e in ("load_start", "load_end", "consume_start", "consume_end")]
    assert any("loaded only after" in v for v in _overlap_violations(serial, 8, 2))
    swapped = [(e, {3: 4, 4: 3}.get(k, k)) for e, k in _loader_events(1, 2)]
    assert any("in order" in v for v in _overlap_violations(swapped, 8, 2))
    greedy = [("load_start", k) for k in range(8)] + [(e, k) for k in range(8) for e in ("consume_start", "consume_end")]
    assert any("loads started" in v for v in _overlap_violations(greedy, 8, 2))
    with pytest.raises(ValueError):
        PrefetchLoader([], lambda it: ([], {}), threads=0)


@pytest.mark.skipif(not HAS_AFFINITY, reason="no sched_setaffinity on this OS")
def test_pinning_applies_to_every_thread_and_restores_the_affinity():
    import os

    before = os.sched_getaffinity(0)
    core = min(before)
    seen = {}
    with pinned([core]) as cores:
        assert cores == [core] and os.sched_getaffinity(0) == {core}
        th = threading.Thread(target=lambda: seen.update(inner=os.sched_getaffinity(0)))
        th.start()
        th.join()
    assert seen["inner"] == {core}                       # a loader thread started inside inherits the pin
    assert os.sched_getaffinity(0) == before            # restored afterwards
    with pytest.raises(RuntimeError):                    # restored on an error too
        with pinned([core], whole_process=False):
            raise RuntimeError("boom")
    assert os.sched_getaffinity(0) == before


def test_split_cores_gives_the_trainer_one_core_and_degrades_on_one():
    trainer, dpp, note = split_cores([3, 1])
    if HAS_AFFINITY:
        assert (trainer, dpp) == ([1], [3]) and "DPP workers" in note
    t1, d1, n1 = split_cores([0])
    assert t1 == d1 == [0] and ("only 1 core" in n1 or not HAS_AFFINITY)
    with pytest.raises(ValueError):
        split_cores([])
    assert available_cores()


def test_the_cpu_trainer_step_is_real_dlrm_work(dataset):
    p, storage, items = dataset
    used = p.used_columns()
    batch = d.process_item(items[0], storage.open_input, used, p, projected=True)[0][0]
    trainer = Trainer(p, used, "cpu", passes=3)
    first = [x.detach().clone() for x in trainer.model.parameters()]
    trainer.step(batch)
    assert trainer.steps == 1 and trainer.samples == batch.rows and math.isfinite(trainer.loss)
    assert any(not np.array_equal(a.numpy(), b.detach().numpy()) for a, b in zip(first, trainer.model.parameters()))
    passes, pass_ms = calibrate_passes(p.model_copy(update={"step_ms": 5.0}), used, batch, repeats=3)
    assert passes >= 1 and pass_ms > 0
    assert calibrate_passes(p.model_copy(update={"step_ms": 0.0}), used, batch, repeats=1)[0] == 1


def test_the_dask_executor_keeps_the_trainers_worker_out():
    from mlsys_flows.tasks.dsi import DaskExecutor

    class Client:
        def __init__(self, ws):
            self.ws = ws

        def nthreads(self):
            return {w: 1 for w in self.ws}

    p = Params.for_scale("smoke")
    assert DaskExecutor(Client(["a", "b"]), None, [], p, exclude="a").workers() == ["b"]
    assert DaskExecutor(Client(["a"]), None, [], p, exclude="a").workers() == ["a"]  # the only one: kept
    assert sorted(DaskExecutor(Client(["a", "b"]), None, [], p).workers()) == ["a", "b"]


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
    # at least one copy raced the straggler (on a loaded machine a copy can outlive its lease too, and be
    # copied again): whatever the count, each item was delivered exactly once (above)
    assert sum(i == items[0].id for i, _ in ex.submitted) >= 2
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
