"""Hotline's background gather (on another thread, while the caller works: checked with a gate,
not a clock) and its update being hybrid's. How much of the gather overlaps compute in a real run is
a timing question, measured and reported by the hotline flow (``gather_overlap``, measured, in its
RunReport), not asserted here."""
import threading
from concurrent.futures import Future

import numpy as np
import pytest

from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.tier import SlowTier
from mlsys_flows.systems.recsys_embeddings.trainer import Trainer, init_tables
from mlsys_flows.systems.hotline import Params


class Gate:
    """Wraps a tier's gather: each call records its thread and then waits, up to ``hold_s``, for the
    caller to open the gate. A gather_async that runs the gather on the caller's thread therefore
    blocks its caller until the wait gives up, and fails."""

    def __init__(self, gather, hold_s: float):
        self.gather_real, self.hold_s = gather, hold_s
        self.open, self.threads = threading.Event(), []

    def gather(self, ids, with_state=False):
        self.threads.append(threading.get_ident())
        if not self.open.wait(self.hold_s):
            raise AssertionError(f"gather not in the background: the caller was held {self.hold_s} s in the "
                                 "gather instead of going on with its work")
        return self.gather_real(ids, with_state)


def check_background(gather_async, gate: Gate, ids):
    """gather_async returns while its gather is still held at the gate (the caller goes on with its
    work), and the gather ran on another thread and delivers the rows once the gate opens."""
    fut = gather_async(ids)
    assert not fut.done(), "gather not in the background: it finished before the caller opened the gate"
    other_work = sum(range(1000))  # the popular micro-batch's compute, while the gather waits
    gate.open.set()
    rows, took = fut.result(timeout=120)
    assert other_work and took >= 0
    assert gate.threads and threading.get_ident() not in gate.threads, \
        "gather not in the background: it ran on the caller's thread"
    return rows


@pytest.fixture(scope="module")
def tier():
    table = np.random.default_rng(0).normal(size=(400_000, 16)).astype(np.float32)
    with SlowTier(table) as t:
        t.table = table
        yield t


def test_background_gather_overlaps_other_work(tier, monkeypatch):
    ids = np.arange(0, 400_000, 1)
    gate = Gate(tier.gather, hold_s=120)  # opened at once by check_background; 120 s only guards a hang
    monkeypatch.setattr(tier, "gather", gate.gather)
    rows = check_background(tier.gather_async, gate, ids)
    assert np.array_equal(rows, tier.table[ids])


@pytest.mark.parametrize("gate_open", [False, True], ids=["held", "open"])
def test_the_background_check_fails_for_a_synchronous_gather(tier, monkeypatch, gate_open):
    """Companion: the broken version, where the gather runs on the caller's thread before its other
    work starts: held at a closed gate it blocks the caller; through an open one it has finished
    before the caller could open it."""
    ids = np.arange(0, 1000, 1)
    gate = Gate(tier.gather, hold_s=0.2)
    if gate_open:
        gate.open.set()
    monkeypatch.setattr(tier, "gather", gate.gather)

    def synchronous(ids):
        f = Future()
        f.set_result((tier.gather(ids), 0.0))
        return f

    with pytest.raises(AssertionError, match="not in the background"):
        check_background(synchronous, gate, ids)


def test_hotline_applies_hybrids_update():
    p = Params.for_scale("smoke", samples=1024, test_samples=256, batch_size=256, evals_per_epoch=1)
    ds = ex.dataset(p)
    hot, _ = ex.hot_rows(ds, p)
    finals = {}
    for name in ("hybrid", "hotline"):
        tr = Trainer(ds, ex.config(p), ex.variant(name, p, hot), init_tables(ds.offsets, p.embedding_dim, p.seed))
        r = tr.run()
        finals[name] = (r, [x.detach().clone() for x in tr.params])
    (a, pa), (b, pb) = finals["hybrid"], finals["hotline"]
    assert b.counters["popular_inputs"] > 0 and b.counters["rows_gathered"] < a.counters["rows_gathered"]
    assert abs(a.test_logloss - b.test_logloss) < 1e-4
    for x, y in zip(pa, pb):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-4)


def test_parity_check_fails_a_variant_that_trains_worse():
    runs = {"hybrid": [{"test_logloss": 0.50}], "hotline": [{"test_logloss": 0.5015}]}
    assert ex.check_parity(runs, 0.002)["hotline"] == pytest.approx(0.0015)
    runs["slipstream"] = [{"test_logloss": 0.503}]
    with pytest.raises(ex.ParityError, match="slipstream"):
        ex.check_parity(runs, 0.002)


def test_time_to_target_interpolates_between_evaluations():
    curve = [(0.0, 0, 0.70, 0.5), (1.0, 10, 0.60, 0.6), (2.0, 20, 0.50, 0.7)]
    assert ex.time_to_target(curve, 0.55) == pytest.approx(1.5)
    assert ex.time_to_target(curve, 0.60) == pytest.approx(1.0)
    assert ex.time_to_target(curve, 0.40) == float("inf")
