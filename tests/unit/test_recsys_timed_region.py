"""Every variant of the two-tier trainer prepares its inputs (dedup, hot/cold split, tensors) outside
its timed region, Slipstream's re-preparation of a popular micro-batch shrunk by a skip included
(issue 44, item 3). The check does not read the wall clock: the trainer's clock is replaced by one
on which every ``prepare()`` costs PENALTY seconds, so a variant whose training time contains a
preparation reports at least PENALTY seconds, whatever the machine's speed."""
from __future__ import annotations

import time as real_time
from types import SimpleNamespace

import pytest

from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings import trainer as tr

PENALTY = 1.0e4  # seconds a preparation costs on the fake clock (a run here takes a few real seconds)


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
    """Train ``v`` with every ``prepare()`` costing PENALTY seconds on the trainer's clock: (result,
    preparations made after the plan was built, i.e. inside the training loop)."""
    offset = [0.0]
    calls = {"all": 0, "in_loop": 0}
    in_loop = [False]
    fake_time = SimpleNamespace(perf_counter=lambda: real_time.perf_counter() + offset[0])
    real_prepare = tr.prepare

    def prepare(*a, **k):
        calls["all"] += 1
        calls["in_loop"] += in_loop[0]
        out = real_prepare(*a, **k)
        offset[0] += PENALTY
        return out

    real_evaluate = tr.Trainer.evaluate

    def evaluate(self, tier):  # the first evaluation runs after the plan is built, before the first step
        in_loop[0] = True
        return real_evaluate(self, tier)

    monkeypatch.setattr(tr, "time", fake_time)
    monkeypatch.setattr(tr, "prepare", prepare)
    monkeypatch.setattr(tr.Trainer, "evaluate", evaluate)
    r = tr.train(ds, cfg, v)
    return r, calls


def check_untimed_preparation(r) -> None:
    if r.train_time_s >= PENALTY or any(t >= PENALTY for t, *_ in r.curve):
        raise AssertionError(f"{r.name} prepares inside its timed region: its training time "
                             f"{r.train_time_s:.0f} s contains a preparation's {PENALTY:.0f} s")


@pytest.mark.parametrize("name", ["hybrid", "fae", "cache", "hotline", "hotline_sync", "slipstream"])
def test_every_variant_prepares_outside_its_timed_region(small, monkeypatch, name):
    p, ds, hot = small
    r, calls = charged_run(monkeypatch, ds, ex.config(p), ex.variant(name, p, hot))
    assert calls["all"] > 0
    check_untimed_preparation(r)
    if name == "slipstream":
        # it did skip, so it prepared its kept inputs again inside the loop, and that time is counted apart
        assert r.counters["skipped"] > 0 and calls["in_loop"] > 0
        assert r.counters["prepare_s"] >= calls["in_loop"] * PENALTY
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
    r, calls = charged_run(monkeypatch, ds, ex.config(p), ex.variant("hotline", p, hot))
    assert calls["in_loop"] > 0
    with pytest.raises(AssertionError, match="prepares inside its timed region"):
        check_untimed_preparation(r)
