"""Slipstream's staleness rule: drift between snapshots, the threshold chosen on a sample, and the
inputs skipped (only those touching nothing but stale hot rows)."""
import numpy as np
import pytest

from mlsys_flows.systems.recsys_embeddings.hot import StalenessRule, hot_slots, row_drift, skip_mask


def reference_skip(ids, hot_rows, stale_rows):
    return np.array([all(int(r) in hot_rows and int(r) in stale_rows for r in row) for row in ids])


def check_skips(ids, hot_rows, stale_rows, mask):
    if not np.array_equal(reference_skip(ids, hot_rows, stale_rows), mask):
        raise AssertionError("skipped inputs differ from the rule")


def test_drift_is_relative_row_change():
    snap = np.array([[3.0, 4.0], [1.0, 0.0]], np.float32)
    now = np.array([[3.0, 4.5], [1.0, 0.0]], np.float32)
    np.testing.assert_allclose(row_drift(now, snap), [0.1, 0.0], rtol=1e-6)


def test_only_inputs_with_every_row_hot_and_stale_are_skipped():
    rng = np.random.default_rng(0)
    hot_rows = np.arange(0, 40)
    slots = hot_slots(hot_rows, 60)
    stale = rng.random(40) < 0.7
    ids = rng.integers(0, 45, (500, 3))
    mask = skip_mask(ids, slots, stale)
    stale_rows = set(np.flatnonzero(stale).tolist())
    check_skips(ids, set(hot_rows.tolist()), stale_rows, mask)
    assert 0 < mask.sum() < len(mask)
    s = slots[ids]
    any_stale = np.array([any(x >= 0 and stale[x] for x in row) for row in s])  # the wrong rule
    with pytest.raises(AssertionError):
        check_skips(ids, set(hot_rows.tolist()), stale_rows, any_stale)


def test_rule_picks_threshold_on_a_sample_within_max_skip():
    rng = np.random.default_rng(1)
    n_hot = 200
    slots = hot_slots(np.arange(n_hot), 300)
    inputs = rng.integers(0, 220, (3000, 2))
    rule = StalenessRule(slots, max_skip=0.2, sample=500)
    w = rng.normal(size=(n_hot, 4)).astype(np.float32)
    rule.observe(w, inputs, rng)             # first snapshot: nothing stale yet
    assert not rule.skippable(inputs).any()
    moved = w.copy()
    moved[:100] += 0.001                     # rows 0..99 barely move (saturated), the others move a lot
    moved[100:] += rng.normal(size=(100, 4)).astype(np.float32)
    rule.observe(moved, inputs, rng)
    assert rule.threshold is not None and rule.threshold > 0
    share = rule.skippable(inputs).mean()
    assert 0 < share <= 0.2 + 0.05           # within max_skip (chosen on a sample, checked on all)
    assert rule.stale[:100].mean() > rule.stale[100:].mean()
    tight = StalenessRule(slots, max_skip=0.0, sample=500)
    tight.observe(w, inputs, rng)
    tight.observe(moved, inputs, rng)
    assert not tight.skippable(inputs).any()  # no skipping allowed: nothing skipped
