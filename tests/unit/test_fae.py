"""FAE's pure pieces: the profiler under a budget, hot/cold input classification, the phase
schedule, and the slow-tier process (gather, update, sync) the family's trainer uses."""
from collections import Counter

import numpy as np
import pytest

from mlsys_flows.systems.fae import Params
from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.recsys_embeddings.hot import budget_rows, hot_inputs, hot_slots, profile_hot_rows
from mlsys_flows.systems.recsys_embeddings.tier import SlowTier, adagrad_rows
from mlsys_flows.systems.recsys_embeddings.trainer import fae_schedule


def reference_hot_inputs(ids: np.ndarray, hot: set) -> np.ndarray:
    return np.array([all(int(r) in hot for r in row) for row in ids])


def check_classification(ids, hot_rows, mask):
    """Hot inputs are exactly those whose every row is hot (raises otherwise)."""
    ref = reference_hot_inputs(ids, set(hot_rows.tolist()))
    if not np.array_equal(ref, mask):
        raise AssertionError(f"{int((ref != mask).sum())} inputs misclassified")


def test_hot_inputs_are_those_with_every_row_hot():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (400, 5))
    hot_rows = np.sort(rng.choice(50, 35, replace=False))
    mask = hot_inputs(ids, hot_slots(hot_rows, 50))
    check_classification(ids, hot_rows, mask)
    assert 0 < mask.sum() < len(mask)  # the case is not trivial
    broken = mask.copy()
    broken[np.flatnonzero(~mask)[0]] = True  # an input with a cold row called hot
    with pytest.raises(AssertionError, match="misclassified"):
        check_classification(ids, hot_rows, broken)
    any_hot = (hot_slots(hot_rows, 50)[ids] >= 0).any(axis=1)  # the wrong rule (one hot row suffices)
    with pytest.raises(AssertionError):
        check_classification(ids, hot_rows, any_hot)


def test_profile_keeps_the_most_accessed_rows_within_the_budget():
    rng = np.random.default_rng(1)
    ids = np.minimum(rng.zipf(1.3, (2000, 4)), 500) - 1
    hot, profiled = profile_hot_rows(ids, 500, 1.0, 20, rng)
    assert profiled == 2000 and len(hot) == 20
    counts = Counter(ids.ravel().tolist())
    kth = sorted(counts.values(), reverse=True)[19]
    assert all(counts[int(r)] >= kth for r in hot)
    small, _ = profile_hot_rows(ids, 500, 0.05, 10_000, np.random.default_rng(2))  # the budget exceeds the rows seen
    assert set(small.tolist()) <= set(np.unique(ids).tolist()) and len(small) < 500
    assert budget_rows(1.0, 16) == 15625


def test_fae_schedule_covers_each_input_once_and_keeps_phases_pure():
    rng = np.random.default_rng(3)
    order = rng.permutation(1000)
    hot = rng.random(1000) < 0.6
    plan = fae_schedule(order, hot, 64, phase_batches=4)  # 10 hot batches: 3 phases of at most 4
    seen = np.concatenate([b for _, b in plan])
    assert np.array_equal(np.sort(seen), np.arange(1000))
    assert all(hot[b].all() if is_hot else (~hot[b]).all() for is_hot, b in plan)
    switches = sum(a[0] != b[0] for a, b in zip(plan, plan[1:]))
    assert switches == 2 * 3 - 1
    runs, cur = [], 0  # hot batches per hot phase: the phase length is set in hot batches
    for is_hot, _ in plan:
        if is_hot:
            cur += 1
        elif cur:
            runs.append(cur)
            cur = 0
    assert runs and max(runs) <= 4 and sum(runs) == 10


def test_slow_tier_process_gathers_updates_and_stops():
    rng = np.random.default_rng(4)
    table = rng.normal(size=(1000, 8)).astype(np.float32)
    with SlowTier(table) as tier:
        ids = np.array([3, 7, 999])
        assert np.array_equal(tier.gather(ids), table[ids])
        g = rng.normal(size=(3, 8)).astype(np.float32)
        tier.update(ids, g, 0.1)
        w, acc = adagrad_rows(table[ids], np.zeros(3, np.float32), g, 0.1)
        both = tier.gather(ids, with_state=True)
        np.testing.assert_allclose(both[:, :8], w, rtol=1e-6)
        np.testing.assert_allclose(both[:, 8], acc, rtol=1e-6)
        tier.write(ids, np.zeros((3, 9), np.float32))
        assert not tier.gather(ids).any()
        proc = tier.proc
        assert tier.alive
    assert proc.poll() is not None  # stopped with the trainer: no leaked process


def test_params_reject_bad_values_by_name():
    with pytest.raises(ParamsError, match="budget_sweep_mb"):
        Params.for_scale("smoke", budget_sweep_mb=(-1.0,))
    with pytest.raises(ParamsError, match="parity_gap"):
        Params.for_scale("smoke", parity_gap=0)


def test_regime_sweep_runs_every_variant_at_every_cost_on_the_same_inputs():
    """The regime's points: each variant once per added cost, on the first regime_samples inputs; the
    counted traffic does not depend on the tier's speed; a point with an added cost is emulated."""
    from mlsys_flows.systems.fae import Params
    from mlsys_flows.systems.recsys_embeddings import experiment as ex

    p = Params.for_scale("smoke", samples=1024, test_samples=256, batch_size=256, regime_samples=512,
                         regime_slow_row_us=[0.0, 5.0])
    ds = ex.dataset(p)
    sub = ds.head(512, 100)
    assert sub.train == 512 and len(sub.labels) == 612 and np.array_equal(sub.ids[:512], ds.ids[:512])
    assert np.array_equal(sub.split("test")[1], ds.split("test")[1][:100])
    hot, _ = ex.hot_rows(ds, p)
    sweep = ex.regime_sweep(ds, p, [ex.variant(n, p, hot) for n in ("hybrid", "cache")])
    assert sorted(sweep) == [0.0, 5.0] and all(set(r) == {"hybrid", "cache"} for r in sweep.values())
    for name in ("hybrid", "cache"):
        assert sweep[0.0][name]["samples"] == sweep[5.0][name]["samples"] == 512
        assert sweep[0.0][name]["rows_gathered"] == sweep[5.0][name]["rows_gathered"] > 0
    assert sweep[0.0]["cache"]["rows_gathered"] < sweep[0.0]["hybrid"]["rows_gathered"]
    samples, note, assumed = ex.regime_result(sweep, "train_time_s", p, "cache", ("hybrid",))
    # the tier sleeps at an added cost: that point is emulated, the tier as it is measured
    assert [s.value for s in samples] == [0.0, 5.0] and [s.kind for s in samples] == ["measured", "emulated"]
    assert [bool(s.emulated) for s in samples] == [False, True]  # the harness refuses such a point labelled measured
    assert samples[1].samples["hybrid"] == [sweep[5.0]["hybrid"]["train_time_s"]] and "512" in note
    assert assumed["slow_row_us"].value == "5" and "sleeps" in assumed["slow_row_us"].source
    # the cache trains hybrid's update, so both keep the parity at every point
    assert all(s.valid and not s.invalid for s in samples)
