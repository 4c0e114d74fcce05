"""Every variant of the two-tier trainer prepares its inputs (dedup, hot/cold split, tensors) outside
its timed region, Slipstream's re-preparation of a popular micro-batch shrunk by a skip included
(issue 44, item 3), and pauses the clock around that preparation alone. The check does not read the
wall clock: the trainer's clock is replaced by one that moves only when charged, PENALTY seconds for
every ``prepare()`` and STEP seconds for every training step, so a variant whose training time
contains a preparation reports at least PENALTY seconds, and one whose paused window holds more
than its preparations (a step) counts more than their PENALTY seconds in ``prepare_s``, whatever the
machine's speed."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings import trainer as tr
from mlsys_flows.systems.recsys_embeddings.device import Placement

PENALTY = 1.0e4  # seconds a preparation costs on the fake clock
STEP = 1.0       # seconds a training step costs on it (a run here makes a few dozen steps)


@pytest.fixture(scope="module")
def small():
    from mlsys_flows.systems.slipstream import Params

    # the trained fixture of test_slipstream.py: a pick every two steps, so Slipstream skips inputs
    p = Params.for_scale("smoke", samples=4096, test_samples=512, batch_size=256, epochs=2, snapshot_every=2,
                         stale_warmup=4, max_loss_increase=0.0)
    ds = ex.dataset(p)
    hot, _ = ex.hot_rows(ds, p)
    return p, ds, hot


def charged_run(monkeypatch, ds, cfg, v):
    """Train ``v`` on a clock that moves only by PENALTY seconds per ``prepare()`` and STEP seconds per
    ``Trainer.step``: (result, counts: ``all`` preparations, ``in_loop`` those made after the plan was
    built, ``steps``; ``events``: the loop's prepare/sync/step calls in order)."""
    offset = [0.0]
    calls = {"all": 0, "in_loop": 0, "steps": 0}
    events: list[str] = []
    in_loop = [False]
    fake_time = SimpleNamespace(perf_counter=lambda: offset[0])
    real_prepare, real_step, real_sync = tr.prepare, tr.Trainer.step, Placement.sync

    def prepare(*a, **k):
        calls["all"] += 1
        calls["in_loop"] += in_loop[0]
        if in_loop[0]:
            events.append("prepare")
        out = real_prepare(*a, **k)
        offset[0] += PENALTY
        return out

    def step(self, micros, tier):
        calls["steps"] += 1
        events.append("step")
        out = real_step(self, micros, tier)
        offset[0] += STEP
        return out

    def sync(self):
        if in_loop[0]:
            events.append("sync")
        return real_sync(self)

    real_evaluate = tr.Trainer.evaluate

    def evaluate(self, tier):  # the first evaluation runs after the plan is built, before the first step
        in_loop[0] = True
        return real_evaluate(self, tier)

    monkeypatch.setattr(tr, "time", fake_time)
    monkeypatch.setattr(tr, "prepare", prepare)
    monkeypatch.setattr(tr.Trainer, "step", step)
    monkeypatch.setattr(Placement, "sync", sync)
    monkeypatch.setattr(tr.Trainer, "evaluate", evaluate)
    r = tr.train(ds, cfg, v)
    return r, calls, events


def check_untimed_preparation(r) -> None:
    if r.train_time_s >= PENALTY or any(t >= PENALTY for t, *_ in r.curve):
        raise AssertionError(f"{r.name} prepares inside its timed region: its training time "
                             f"{r.train_time_s:.0f} s contains a preparation's {PENALTY:.0f} s")


def check_paused_window(r, calls) -> None:
    """The clock pauses around the in-loop preparations and nothing else: ``prepare_s`` is their charged
    time, and every step's charge is in the training time."""
    charged = calls["in_loop"] * PENALTY
    if r.counters.get("prepare_s", 0.0) > charged + STEP / 2:
        raise AssertionError(f"{r.name} pauses its clock around more than its preparations: prepare_s "
                             f"{r.counters['prepare_s']:.0f} s > {calls['in_loop']} x {PENALTY:.0f} s")
    assert r.counters.get("prepare_s", 0.0) == pytest.approx(charged, abs=STEP / 2)
    assert r.train_time_s == pytest.approx(calls["steps"] * STEP, abs=STEP / 2)


@pytest.mark.parametrize("name", ["hybrid", "fae", "cache", "hotline", "hotline_sync", "slipstream"])
def test_every_variant_prepares_outside_its_timed_region(small, monkeypatch, name):
    p, ds, hot = small
    r, calls, events = charged_run(monkeypatch, ds, ex.config(p), ex.variant(name, p, hot))
    assert calls["all"] > 0 and calls["steps"] > 0
    check_untimed_preparation(r)
    check_paused_window(r, calls)
    if name == "slipstream":
        # it did skip, so it prepared its kept inputs again inside the loop, and that time is counted apart
        assert r.counters["skipped"] > 0 and calls["in_loop"] > 0
        # the device's queued work is waited for before the pause and the preparation's copy inside it
        # (no-ops on the CPU; on CUDA the paused window then holds no queued training kernels)
        at = [i for i, e in enumerate(events) if e == "prepare"]
        assert all(events[i - 1] == "sync" and events[i + 1] == "sync" for i in at), events
    else:
        assert calls["in_loop"] == 0 and r.counters.get("prepare_s", 0.0) == 0


def test_a_variant_preparing_inside_the_clock_is_caught(small, monkeypatch):
    """The check can fail: a hotline whose step prepares its popular micro-batch again (as Slipstream's
    loop did before issue 44) is refused."""
    p, ds, hot = small
    real_step = tr.Trainer.step

    def step(self, micros, tier):
        pop = micros[0]
        micros = [tr.prepare(pop.host_dense, pop.ids, pop.host_labels, self.slots, False, self.place), *micros[1:]]
        return real_step(self, micros, tier)

    monkeypatch.setattr(tr.Trainer, "step", step)
    r, calls, _ = charged_run(monkeypatch, ds, ex.config(p), ex.variant("hotline", p, hot))
    assert calls["in_loop"] > 0
    with pytest.raises(AssertionError, match="prepares inside its timed region"):
        check_untimed_preparation(r)

