"""The checkpoint system's contract-v3 parts: the mechanism's ablation saver (background write, no
in-memory snapshot), the split of the stall into in-loop and final drain, and the state-size sweep."""
from __future__ import annotations

import threading

import torch

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.systems.checkpoint import SWEPT, Params
from mlsys_flows.systems.checkpoint.bench import summarize, sweep_widths
from mlsys_flows.systems.checkpoint.savers import SerializeAsyncSaver, make_saver
from mlsys_flows.systems.checkpoint.train import train


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_serialize_saver_checkpoint_is_the_state_at_save_time_and_keeps_last(local_storage):
    store = CheckpointStore(storage=local_storage, keep_last=2)
    model, opt = _model()
    expected = {}
    with SerializeAsyncSaver(store, "run") as saver:
        for step in range(1, 5):
            saver.save(step, {"model": model.state_dict(), "step": step})
            expected[step] = model.weight.detach().clone()
            with torch.no_grad():
                model.weight.add_(1.0)  # mutated right after save: the blob was serialised before
    assert [e["step"] for e in store.manifest("run")] == [3, 4]
    step, state = store.restore("run")
    assert step == 4 and torch.equal(state["model"]["weight"], expected[4])
    assert torch.equal(store.restore("run", 3)[1]["model"]["weight"], expected[3])
    assert len(saver.flushes) == 4 and all(f["copy_s"] > 0 for f in saver.flushes)


def test_serialize_saver_writes_in_the_background(local_storage):
    store = CheckpointStore(storage=local_storage)
    gate, entered = threading.Event(), threading.Event()
    real = local_storage.write_bytes

    def slow_write(key, data):
        entered.set()
        gate.wait(5)
        return real(key, data)

    local_storage.__dict__["write_bytes"] = slow_write  # the background write blocks until released
    saver = SerializeAsyncSaver(store, "bg")
    saver.save(1, {"x": torch.ones(4)})  # returns although the write has not finished
    assert entered.wait(5) and store.manifest("bg") == []
    gate.set()
    saver.wait()
    assert [e["step"] for e in store.manifest("bg")] == [1]


def test_make_saver_covers_every_variant(local_storage):
    store = CheckpointStore(storage=local_storage)
    assert make_saver(store, "none", "r") is None
    assert isinstance(make_saver(store, "async_serialize", "r"), SerializeAsyncSaver)
    assert make_saver(store, "async", "r").lazy and not make_saver(store, "async_eager", "r").lazy
    assert not make_saver(store, "sync", "r").asynchronous


class _Slow:
    """A saver whose final wait takes a while and whose save takes less: the drain is told apart."""

    def __init__(self):
        self.flushes = []

    def save(self, step, state):
        self.flushes.append({"step": step, "bytes": 1, "seconds": 0.01, "copy_s": 0.0})

    def before_update(self):
        pass

    def wait(self):
        threading.Event().wait(0.2)


def test_in_loop_stall_excludes_the_final_drain():
    res = train(16, 1, 4, 4, 0, saver=_Slow(), every=2)
    assert res.drain_s >= 0.2 and res.loop_stall_s < 0.1
    run = summarize(res, [{"bytes": 1, "seconds": 0.01, "copy_s": 0.0}] * 2)
    assert run["stall_s_per_checkpoint"] == res.loop_stall_s / 2 and run["drain_s"] == res.drain_s


def test_sweep_runs_every_variant_at_each_width_but_the_headline_one():
    p = Params.for_scale("smoke", width=32, depth=1, batch_size=4, steps=4, every=2, regime_widths=[16, 32, 48])
    made = []

    def make(v, w, i):
        made.append((v, w))
        return _Slow()

    out = sweep_widths(p, make)
    assert set(out) == {16, 48} and all(set(out[w]) == set(SWEPT) for w in out)
    assert sorted(made) == sorted((v, w) for v in SWEPT for w in (16, 48))
    assert all(r["checkpoints"] == 2 for w in out for r in out[w].values())
