"""Slipstream's staleness rule: drift between snapshots, the threshold chosen on a sample, and the
inputs skipped (only those touching nothing but stale hot rows)."""
import numpy as np
import pytest

from mlsys_flows.systems.recsys_embeddings.hot import StalenessRule, hot_slots, row_drift, skip_mask, update_scale


def reference_skip(ids, hot_rows, stale_rows):
    return np.array([all(int(r) in hot_rows and int(r) in stale_rows for r in row) for row in ids])


def check_skips(ids, hot_rows, stale_rows, mask):
    if not np.array_equal(reference_skip(ids, hot_rows, stale_rows), mask):
        raise AssertionError("skipped inputs differ from the rule")


def test_drift_is_row_change_in_update_units():
    snap = np.array([[3.0, 4.0], [1.0, 0.0]], np.float32)
    now = np.array([[3.0, 4.5], [1.0, 0.0]], np.float32)
    np.testing.assert_allclose(row_drift(now, snap, scale=0.25), [2.0, 0.0], rtol=1e-6)
    assert update_scale(0.02, 16, 10) == pytest.approx(0.02 * 4 * 10)


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
    popular = (slots[inputs] >= 0).all(axis=1)
    rule = StalenessRule(slots, max_skip=0.2, sample=500)
    w = rng.normal(size=(n_hot, 4)).astype(np.float32)
    rule.observe(w, inputs, rng)             # first snapshot: nothing stale yet
    assert not rule.skippable(inputs).any()
    moved = w.copy()
    moved[:100] += 0.001                     # rows 0..99 barely move (saturated), the others move a lot
    moved[100:] += rng.normal(size=(100, 4)).astype(np.float32)
    rule.observe(moved, inputs, rng)
    assert rule.threshold is not None and rule.threshold > 0
    share = rule.skippable(inputs)[popular].mean()
    assert 0 < share <= 0.2 + 0.05           # within max_skip of the popular inputs (sampled, checked on all)
    assert rule.stale[:100].mean() > rule.stale[100:].mean()
    tight = StalenessRule(slots, max_skip=0.0, sample=500)
    tight.observe(w, inputs, rng)
    tight.observe(moved, inputs, rng)
    assert not tight.skippable(inputs).any()  # no skipping allowed: nothing skipped


def check_not_degenerate(rule: StalenessRule, inputs: np.ndarray, max_skip: float) -> None:
    """The threshold must decide: the skip cap binds (the picked quantile is below the grid's top, so
    a larger threshold would skip too many popular inputs), and what it skips stays within the cap."""
    popular = (rule.slots[inputs] >= 0).all(axis=1)
    q, _ = rule.picks[-1]
    if q >= max(rule.quantiles):
        raise AssertionError(f"degenerate threshold: the top quantile {q} was picked, the skip cap never binds")
    share = rule.skippable(inputs)[popular].mean()
    if not 0 < share <= max_skip + 0.05:
        raise AssertionError(f"degenerate threshold: it skips {share:.0%} of the popular inputs (cap {max_skip:.0%})")


def test_threshold_is_not_degenerate_and_ignores_the_rows_norms():
    """Popular inputs are a fifth of the inputs and every hot row barely moves: a cap counted over all
    inputs (the old rule) never binds and skips every popular input; a drift relative to the rows'
    norms changes with their init scale. The rule caps the popular share and measures drift in update
    units, so the same movement from rows ten times larger picks the same threshold."""
    rng = np.random.default_rng(5)
    n_hot = 400
    slots = hot_slots(np.arange(n_hot), 2000)
    hot_in = rng.integers(0, n_hot, (600, 3))
    cold_in = rng.integers(n_hot, 2000, (2400, 3))
    inputs = np.concatenate([hot_in, cold_in])
    step = rng.normal(size=(n_hot, 4)).astype(np.float32) * np.linspace(0.001, 0.01, n_hot)[:, None]
    thresholds = []
    for norm in (1.0, 10.0):
        w = norm * rng.normal(size=(n_hot, 4)).astype(np.float32)
        rule = StalenessRule(slots, max_skip=0.3, scale=0.05, sample=1000)
        rule.observe(w, inputs, np.random.default_rng(0))
        rule.observe(w + step, inputs, np.random.default_rng(0))
        check_not_degenerate(rule, inputs, 0.3)
        thresholds.append(rule.threshold)
    assert thresholds[0] == pytest.approx(thresholds[1])

    old = StalenessRule(slots, max_skip=0.3, scale=0.05, sample=1000)  # the old rule: cap over all inputs
    old.observe(w, inputs, np.random.default_rng(0))
    old.stale = np.ones(n_hot, bool)   # the top quantile of a rule whose cap never binds: every hot row stale
    old.threshold, old.picks = 1.0, [(0.9, 0.2)]
    with pytest.raises(AssertionError, match="degenerate"):
        check_not_degenerate(old, inputs, 0.3)
