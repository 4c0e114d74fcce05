"""The checkpoint system's contract-v3 parts: the mechanism's ablation saver (background write, no
in-memory snapshot), the split of the stall into in-loop and final drain, and the state-size sweep."""
from __future__ import annotations

import threading

import pytest
import torch

from mlsys_flows.blocks import CheckpointStore
from mlsys_flows.systems.checkpoint import SWEPT, Params
from mlsys_flows.systems.checkpoint.bench import summarize, sweep_widths
from mlsys_flows.systems.checkpoint.savers import DcpAsyncSaver, SerializeAsyncSaver, make_saver
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
    assert isinstance(make_saver(store, "dcp_async", "r"), DcpAsyncSaver) and not make_saver(store, "dcp_async", "r").lazy
    assert make_saver(store, "dcp_async_lazy", "r").lazy
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


def test_sweep_runs_every_variant_at_each_width_but_the_headline_one_at_the_bench_length():
    p = Params.for_scale("smoke", width=32, depth=1, batch_size=4, steps=6, every=2, regime_widths=[16, 32, 48])
    made = []

    def make(v, w, i):
        made.append((v, w))
        return _Slow()

    out = sweep_widths(p, make)
    assert set(out) == {16, 48} and all(set(out[w]) == set(SWEPT) for w in out)
    assert sorted(made) == sorted((v, w) for v in SWEPT for w in (16, 48))
    # every point runs the bench's length (p.steps): the headline metric includes one drain per run
    assert all(r["checkpoints"] == 3 for w in out for r in out[w].values())


@pytest.mark.parametrize("lazy", [False, True])
def test_dcp_saver_checkpoint_is_the_state_at_save_time_and_keeps_last(local_storage, lazy):
    from mlsys_flows.systems.checkpoint.train import build, state_of

    store = CheckpointStore(storage=local_storage, keep_last=2)
    model, opt = build(16, 1, 0)
    expected = {}
    with DcpAsyncSaver(store, "dcp", lazy=lazy) as saver:
        for step in range(1, 5):
            saver.save(step, state_of(model, opt, step, float(step)))
            expected[step] = model[0].weight.detach().clone()
            saver.before_update()  # lazy: the staging (copy on DCP's stager thread) completes here
            assert saver._staging is None
            with torch.no_grad():
                model[0].weight.add_(1.0)  # mutated right after save: the staged copy was taken before
        restored = {s: saver.restore(state_of(*build(16, 1, 1), 0), s) for s in (3, 4)}
    assert len(saver.flushes) == 4 and all(f["bytes"] > 0 and f["copy_s"] > 0 for f in saver.flushes)
    for s in (3, 4):
        assert torch.equal(restored[s]["model"]["0.weight"], expected[s]) and restored[s]["step"] == s
    # the two newest kept, the older ones deleted
    kept = sorted(k.split("/")[2] for k in local_storage.list("checkpoints/dcp"))
    assert set(kept) == {"step-000000003", "step-000000004"}


def test_dcp_saver_needs_a_local_root():
    import pytest

    class _S3Like:
        is_s3, root_url = True, "s3://bucket/x"

    fake = type("Store", (), {"storage": _S3Like(), "prefix": "checkpoints", "keep_last": 2})()
    with pytest.raises(ValueError, match="local"):
        DcpAsyncSaver(fake, "r")


def _run(it, drain=0.5, ckpts=4):
    return {"iter_time_s": it, "loop_iter_time_s": it - drain / 8, "stall_s_per_iter": 0.01, "stall_s_per_checkpoint":
            0.02, "drain_s": drain, "drain_share": drain / (8 * it), "digest": "ab" * 32, "last_loss": 0.5, "step_s": [it] * 8, "checkpoints": ckpts,
            "checkpoint_bytes": 1e6, "flush_mb_s": 100.0, "copy_gb_s": 2.0}


def test_result_puts_the_regime_on_iteration_time_and_survives_a_missing_dcp_variant():
    from mlsys_flows.systems.checkpoint.result import build_result

    p = Params.for_scale("smoke", regime_widths=[256, 768], repeats=2)
    for with_dcp in (True, False):
        names = [v for v in ("none", "sync", "async_eager", "dcp_async", "dcp_async_lazy", "async_serialize", "async")
                 if with_dcp or not v.startswith("dcp")]
        its = {"none": 0.1, "sync": 0.3, "async_eager": 0.25, "dcp_async": 0.26, "dcp_async_lazy": 0.23,
               "async_serialize": 0.24, "async": 0.22}
        runs = {v: [_run(its[v], drain=0.0 if v in ("none", "sync") else 0.5,
                         ckpts=0 if v == "none" else 4) for _ in range(2)] for v in names}
        swept = {256: {v: _run(its[v] / 10) for v in names if v != "none"}}
        measured = {"runs": runs, "equal_to_sync": {v: 1.0 for v in names if v != "none"}}
        trained = {"digest": "ab" * 32, "last_loss": 0.5, "start_step": 0, "flushes": []}
        res = build_result(p, trained, measured, swept, storage_url="file:///x", run_key=None)
        # the regime's samples are the headline metric (iteration time), at both widths
        assert res.regime[1].samples["async"] == [0.22, 0.22] and res.regime[0].samples["async"] == [0.022]
        assert ("dcp_async" in res.regime[0].samples) == with_dcp
        assert res.samples["async"]["loop_iter_time_s"] == [0.22 - 0.5 / 8] * 2
        assert any("drain included" in n for n in res.notes)
        assert any("dcp_async was not run" in n for n in res.notes) == (not with_dcp)
