"""DSI contract v3 parts: the derived-feature rounds that set the preprocessing cost (real work that
grows with the rounds, leaves the batches unchanged, calibrated to a number of trainer steps), the
regime sweep's rotation, the co-located executor (the mechanism's ablation) and the event-driven
master (woken by done callbacks, polling only for handles without them)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.dsi import SPEC, Params
from mlsys_flows.systems.dsi import data as d
from mlsys_flows.systems.dsi.dpp import Master, run_dpp, sweep_preprocessing
from test_dsi import dataset  # noqa: F401  (the smoke dataset fixture, shared with test_dsi.py)




def _tables(p, storage, item):
    with storage.open_input(item.key) as fh:
        table = d.read_row_group(fh, item.row_group, [d.LABEL, *p.used_columns()], coalesce=True)
    dense = np.stack([d._dense(table.column(c)) for c in p.used_columns() if not c.startswith("sparse")], axis=1)
    sparse = {c: d._sparse(table.column(c), c, 2 * p.sparse_list_len, p.table_rows)
              for c in p.used_columns() if c.startswith("sparse")}
    return dense, sparse


def test_derived_feature_rounds_are_real_work_that_leaves_the_batches_alone(dataset):
    p, storage, items = dataset
    dense, sparse = _tables(p, storage, items[0])
    assert d.derive_features(dense, sparse, p.table_rows, 0) == 0
    one, two = (d.derive_features(dense, sparse, p.table_rows, r) for r in (1, 2))
    assert one != 0 and two != one  # every round adds its own salted work to the checksum

    def cost(rounds):
        t0 = time.perf_counter()
        d.derive_features(dense, sparse, p.table_rows, rounds)
        return time.perf_counter() - t0

    cost(2)
    assert min(cost(60) for _ in range(3)) > 5 * min(cost(2) for _ in range(3))
    plain, _ = d.process_item(items[0], storage.open_input, p.used_columns(), p, projected=True)
    heavy, _ = d.process_item(items[0], storage.open_input, p.used_columns(), p, projected=True, rounds=5)
    for a, b in zip(plain, heavy, strict=True):
        assert np.array_equal(a.dense, b.dense) and np.array_equal(a.labels, b.labels)
        assert all(np.array_equal(x, y) for c in a.sparse for x, y in zip(a.sparse[c], b.sparse[c]))
    assert d.derive_ms_per_batch(items[0], storage.open_input, p.used_columns(), p, repeats=1) > 0


def test_rounds_for_a_cost_in_trainer_steps():
    assert d.rounds_for(0.0, 40.0, 0.8) == 0
    assert d.rounds_for(1.0, 40.0, 0.8) == 50
    assert d.rounds_for(2.0, 40.0, 0.8) == 100
    assert d.rounds_for(1e-6, 40.0, 0.8) == 1  # any extra cost does at least one round
    with pytest.raises(ValueError):
        d.rounds_for(-1.0, 40.0, 0.8)


def test_the_sweep_runs_every_variant_at_every_value_rotating_the_first():
    calls = []
    out = sweep_preprocessing([0.0, 1.0, 2.0], lambda v, x: calls.append((v, x)) or 10 * x + len(v))
    assert list(out) == [0.0, 1.0, 2.0] and all(set(pt) == {"inline", "dpp", "dpp_colocated"} for pt in out.values())
    assert out[2.0]["dpp"] == 23.0
    assert [v for v, x in calls if x == 0.0][0] == "inline" and [v for v, x in calls if x == 1.0][0] == "dpp"
    assert [v for v, x in calls if x == 2.0][0] == "dpp_colocated"


def test_regime_values_and_spec():
    assert Params.for_scale("quick").regime_extra_preprocess == [0.0, 0.5, 1.27, 2.0]
    assert len(Params.for_scale("smoke").regime_extra_preprocess) == 2
    assert Params.for_scale("smoke", regime_extra_preprocess=[2.0, 0.0]).regime_extra_preprocess == [0.0, 2.0]
    with pytest.raises(ParamsError, match="regime_extra_preprocess"):
        Params.for_scale("smoke", regime_extra_preprocess=[1.0, 1.0])
    assert SPEC.contract_v3 and SPEC.mechanism.ablation == "dpp_colocated"
    assert SPEC.regime.parameter in Params.model_fields and SPEC.regime.paper_value == pytest.approx(0.56 / 0.44, 0.01)


def test_the_colocated_executor_uses_only_the_trainers_worker():
    from mlsys_flows.tasks.dsi import DaskExecutor

    class Client:
        def nthreads(self):
            return {"a": 1, "b": 1}

    p = Params.for_scale("smoke")
    assert DaskExecutor(Client(), None, [], p, only="a").workers() == ["a"]
    assert DaskExecutor(Client(), None, [], p, exclude="a").workers() == ["b"]


class _Pool:
    """Workers on a thread pool; ``callbacks=False`` hands out handles without add_done_callback."""

    def __init__(self, storage, p, callbacks=True):
        self.storage, self.p, self.callbacks = storage, p, callbacks
        self.pool = ThreadPoolExecutor(2)

    def workers(self):
        return ["w0", "w1"]

    def submit(self, item, worker):
        fut = self.pool.submit(d.process_item, item, self.storage.open_input, self.p.used_columns(), self.p, True)
        if self.callbacks:
            return fut

        class Bare:  # done/result/cancel only
            done, result, cancel = fut.done, fut.result, fut.cancel
        return Bare()


@pytest.mark.parametrize("callbacks", [True, False])
def test_the_master_sleeps_until_a_result_arrives(dataset, monkeypatch, callbacks):
    p, storage, items = dataset
    p = p.model_copy(update={"control_interval_s": 5.0})
    steps = []
    original = Master.step
    masters = []

    def counting(self, now):
        masters.append(self)
        steps.append(now)
        return original(self, now)

    monkeypatch.setattr(Master, "step", counting)
    metrics, details = run_dpp(items, _Pool(storage, p, callbacks), p.used_columns(), p)
    assert sorted(details["delivered_items"]) == [it.id for it in items]
    m = masters[0]
    assert m.polling is (not callbacks)
    if callbacks:  # one pass per finished item or so, never a 5 ms poll
        assert m.wakeups >= 1 and len(steps) <= 3 * len(items) + 5
    else:
        assert m.wakeups == 0

