"""Hotline's background gather (on another thread, while the caller works: checked with a gate,
not a clock) and its update being hybrid's. How much of the gather overlaps compute in a real run is
a timing question, measured and reported by the hotline flow (``gather_overlap``, measured, in its
RunReport), not asserted here."""
import threading
import time
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
    for name in ("hybrid", "hotline", "hotline_sync", "cache"):
        tr = Trainer(ds, ex.config(p), ex.variant(name, p, hot), init_tables(ds.offsets, p.embedding_dim, p.seed))
        r = tr.run()
        finals[name] = (r, [x.detach().clone() for x in tr.params])
    (a, pa), (b, pb) = finals["hybrid"], finals["hotline"]
    assert b.counters["popular_inputs"] > 0 and b.counters["rows_gathered"] < a.counters["rows_gathered"]
    assert abs(a.test_logloss - b.test_logloss) < 1e-4
    for x, y in zip(pa, pb):
        np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-4)
    # the mechanism ablations train the same update: hotline_sync without the overlap (its gathers
    # all block, none runs in the background), cache with the hot rows but no popular micro-batch
    for name in ("hotline_sync", "cache"):
        r, pr = finals[name]
        assert abs(a.test_logloss - r.test_logloss) < 1e-4, name
        for x, y in zip(pa, pr):
            np.testing.assert_allclose(x.numpy(), y.numpy(), atol=1e-4)
    sync, cache = finals["hotline_sync"][0].counters, finals["cache"][0].counters
    assert sync["gather_s"] == 0 and sync["blocking_gather_s"] > 0 and b.counters["gather_s"] > 0
    assert sync["rows_gathered"] == b.counters["rows_gathered"] == cache["rows_gathered"]
    assert cache["popular_inputs"] == 0 and cache["syncs"] == 0


def test_slow_tier_row_cost_slows_every_row_moved():
    """The regime's knob: with an added cost per row, a gather of n rows takes at least n times it
    (a lower bound: a loaded machine only adds), and the rows are the same."""
    table = np.random.default_rng(1).normal(size=(5000, 8)).astype(np.float32)
    ids = np.arange(0, 5000, 2)
    with SlowTier(table, row_cost_s=20e-6) as slow:
        t0 = time.perf_counter()
        rows = slow.gather(ids)
        took = time.perf_counter() - t0
    assert took >= len(ids) * 20e-6 and np.array_equal(rows, table[ids])
    with pytest.raises(ValueError, match="row_cost_s"):
        SlowTier(table, row_cost_s=-1.0)


def test_projection_hides_hotlines_gather_and_charges_every_row():
    p = Params.for_scale("smoke")
    run = {"train_time_s": 2.0, "slow_tier_share": 0.25, "rows_gathered": 1e6, "rows_sent": 1e6, "sync_rows": 0,
           "popular_inputs": 500, "trained_samples": 1000}
    compute = 1.5
    row_s = 4 * p.embedding_dim / (ex.PCIE_GB_S * 1e9) + ex.HOST_ROW_US * 1e-6
    assert ex.projected_time([run], p, False) == pytest.approx(compute + 2e6 * row_s)
    hidden = ex.projected_time([run], p, True)  # the gather hides behind half the compute (0.75 s)
    assert hidden == pytest.approx(compute + max(0.0, 1e6 * row_s - 0.75) + 1e6 * row_s)
    assert hidden < ex.projected_time([run], p, False)
    assert ex.projected_time([dict(run, sync_rows=1e6)], p, False) > ex.projected_time([run], p, False)


def test_parity_check_fails_a_variant_that_trains_worse():
    runs = {"hybrid": [{"test_logloss": 0.50}], "hotline": [{"test_logloss": 0.5015}]}
    assert ex.check_parity(runs, 0.002)["hotline"] == pytest.approx(0.0015)
    runs["slipstream"] = [{"test_logloss": 0.503}]
    with pytest.raises(ex.ParityError, match="slipstream"):
        ex.check_parity(runs, 0.002)


def test_a_regime_point_is_invalid_where_a_compared_variant_breaks_parity():
    runs = {"hybrid": {"test_logloss": 0.50}, "fae": {"test_logloss": 0.5015}, "hotline": {"test_logloss": 0.504},
            "hotline_sync": {"test_logloss": 0.60}}
    assert ex.parity_break(runs, 0.003, ("fae",)) == ""  # the ablation is not compared: its miss does not count
    broke = ex.parity_break(runs, 0.003, ("hotline", "fae"))
    assert "hotline 0.5040" in broke and "fae" not in broke and "0.5000" in broke


def test_time_to_target_interpolates_between_evaluations():
    curve = [(0.0, 0, 0.70, 0.5), (1.0, 10, 0.60, 0.6), (2.0, 20, 0.50, 0.7)]
    assert ex.time_to_target(curve, 0.55) == pytest.approx(1.5)
    assert ex.time_to_target(curve, 0.60) == pytest.approx(1.0)
    assert ex.time_to_target(curve, 0.40) == float("inf")
