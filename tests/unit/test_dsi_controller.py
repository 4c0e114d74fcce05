"""DPP's regular decisions act on their own evidence, apart from the start-up event (issue 45 item 2 review):
with the start-up event suppressed and DPP the bottleneck, a regular decision adds a worker; with the trainer
the bottleneck and the queue full, a regular decision removes the worker the start-up event added. Every
decision is recorded with its trigger and the stall fraction it read, and the report's note says which
changed the count.

The DPP-bound case is event-driven: every work item waits until a regular decision has been taken, so the
trainer waits through the whole first interval (a stall fraction of one, whatever the machine's speed). The
trainer-bound case hands out precomputed items at once, so the queue is full while the emulated step runs."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi import dpp as D
from mlsys_flows.systems.dsi.result import controller_decisions
from test_dsi import dataset  # noqa: F401  (the smoke dataset fixture, shared with test_dsi.py)


class _Ready:
    """Two workers that hand out precomputed items, each once ``gate`` is set."""

    def __init__(self, storage, p, items, gate: threading.Event | None = None):
        self.pool, self.gate = ThreadPoolExecutor(4), gate
        self.ready = {it.id: d.process_item(it, storage.open_input, p.used_columns(), p, True) for it in items}

    def workers(self):
        return ["w0", "w1"]

    def submit(self, item, worker):
        def work():
            if self.gate is not None:
                self.gate.wait(timeout=30)
            return self.ready[item.id]
        return self.pool.submit(work)


def _params(p, **kw):
    return p.model_copy(update={"control_interval_s": 0.3, "min_workers": 1, "start_workers": 1, "max_workers": 2,
                                "prefetch": 1, **kw})


def test_a_regular_decision_adds_a_worker_when_dpp_is_the_bottleneck(dataset, monkeypatch):
    p, storage, items = dataset
    p = _params(p, step_ms=5.0)
    regular = threading.Event()
    original_decide, original_master = D.Controller.decide, D.Master.decide

    def no_startup(self, now, trigger="regular"):  # the start-up event suppressed: only ticks decide
        return self.controller.target if trigger == "start-up" else original_master(self, now, trigger)

    def recording(self, *a, **kw):
        out = original_decide(self, *a, **kw)
        if self.decisions[-1]["trigger"] == "regular":
            regular.set()  # releases the workers: until now the trainer had nothing to train on
        return out

    monkeypatch.setattr(D.Master, "decide", no_startup)
    monkeypatch.setattr(D.Controller, "decide", recording)
    metrics, details = D.run_dpp(items, _Ready(storage, p, items, gate=regular), p.used_columns(), p)
    decisions = details["decisions"]
    assert decisions and all(x["trigger"] == "regular" for x in decisions)
    first = decisions[0]
    assert first["stall_fraction"] > p.stall_high and (first["before"], first["target"]) == (1, 2), decisions
    assert metrics["workers_max"] == 2
    assert "regular" in controller_decisions(decisions) and "start-up event" not in controller_decisions(decisions)


def test_a_regular_decision_removes_the_startup_worker_when_the_trainer_is_the_bottleneck(dataset):
    p, storage, items = dataset
    p = _params(p, step_ms=40.0, stall_low=0.04, queue_depth=4, batch_size=64)
    assert D.num_batches(items, p.batch_size) * p.step_ms / 1e3 > 3 * p.control_interval_s  # ticks happen
    metrics, details = D.run_dpp(items, _Ready(storage, p, items), p.used_columns(), p)
    decisions = details["decisions"]
    startup = [x for x in decisions if x["trigger"] == "start-up"]
    assert len(startup) == 1 and startup[0]["stall_fraction"] == 1.0 and startup[0]["target"] == 2, decisions
    removed = [x for x in decisions if x["trigger"] == "regular" and (x["before"], x["target"]) == (2, 1)]
    assert removed, decisions
    assert removed[0]["stall_fraction"] < p.stall_low and removed[0]["queue_fill"] >= 0.75
    assert "regular" in controller_decisions(decisions)


def test_the_note_says_when_the_one_change_was_the_startup_event():
    kept = [{"t": 0.1, "trigger": "start-up", "stall_fraction": 1.0, "queue_fill": 0.0, "before": 1, "target": 2},
            {"t": 0.6, "trigger": "regular", "stall_fraction": 0.4, "queue_fill": 0.0, "before": 2, "target": 2}]
    note = controller_decisions(kept)
    assert "start-up stall 1.00" in note and "regular stall 0.40" in note
    assert "the one change was the start-up event; the 1 regular decision(s) kept the count" in note
    grown = kept + [{"t": 1.1, "trigger": "regular", "stall_fraction": 0.3, "queue_fill": 0.0, "before": 2,
                     "target": 3}]
    assert "1 regular and 1 start-up decision(s) changed the count" in controller_decisions(grown)
