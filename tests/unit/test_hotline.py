"""Hotline's background gather (really concurrent, measured) and its update being hybrid's."""
import time
from concurrent.futures import Future

import numpy as np
import pytest

from mlsys_flows.systems.recsys_embeddings import experiment as ex
from mlsys_flows.systems.recsys_embeddings.tier import SlowTier
from mlsys_flows.systems.recsys_embeddings.trainer import Trainer, init_tables
from mlsys_flows.systems.hotline import Params


def measure_overlap(gather_async, ids, work_s):
    """(seconds to submit, seconds waited after ``work_s`` of other work, seconds the gather took, rows)."""
    t0 = time.perf_counter()
    fut = gather_async(ids)
    submit = time.perf_counter() - t0
    time.sleep(work_s)  # the popular micro-batch's compute (it releases the GIL, as torch kernels do)
    t1 = time.perf_counter()
    rows, took = fut.result()
    return submit, time.perf_counter() - t1, took, rows


def check_background(submit, wait, took):
    if not (submit < 0.5 * took and wait < 0.5 * took):
        raise AssertionError(f"gather not in the background: submit {submit:.3f} s, wait {wait:.3f} s, gather {took:.3f} s")


@pytest.fixture(scope="module")
def tier():
    table = np.random.default_rng(0).normal(size=(400_000, 16)).astype(np.float32)
    with SlowTier(table) as t:
        t.table = table
        yield t


def test_background_gather_overlaps_other_work(tier):
    ids = np.arange(0, 400_000, 1)
    took_alone = min(tier.gather_async(ids).result()[1] for _ in range(2))
    submit, wait, took, rows = measure_overlap(tier.gather_async, ids, work_s=max(0.2, 3 * took_alone))
    assert np.array_equal(rows, tier.table[ids])
    check_background(submit, wait, took)

    def synchronous(ids):  # the broken version: the gather runs before the other work starts
        f, t0 = Future(), time.perf_counter()
        f.set_result((tier.gather(ids), time.perf_counter() - t0))
        return f
    with pytest.raises(AssertionError, match="not in the background"):
        check_background(*measure_overlap(synchronous, ids, work_s=0.05)[:3])


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
