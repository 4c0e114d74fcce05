"""Slipstream's staleness rule: drift between snapshots, the threshold chosen on a sample by the loss
change skipping would cause (capped by a skip share), and the inputs skipped (only those touching
nothing but stale hot rows)."""
import numpy as np
import pytest

from mlsys_flows.systems.recsys_embeddings.hot import (Pick, StalenessRule, hot_slots, row_drift, skip_mask,
                                                       update_scale)


def flat(idx: np.ndarray) -> np.ndarray:
    """A loss probe under which every input is learned alike: the loss never decides, the cap does."""
    return np.ones(len(idx))


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
    rule.observe(w, inputs, rng, flat)       # first snapshot: nothing stale yet
    assert not rule.skippable(inputs).any()
    moved = w.copy()
    moved[:100] += 0.001                     # rows 0..99 barely move (saturated), the others move a lot
    moved[100:] += rng.normal(size=(100, 4)).astype(np.float32)
    rule.observe(moved, inputs, rng, flat)
    assert rule.threshold is not None and rule.threshold > 0
    share = rule.skippable(inputs)[popular].mean()
    assert 0 < share <= 0.2 + 0.05           # within max_skip of the popular inputs (sampled, checked on all)
    assert rule.stale[:100].mean() > rule.stale[100:].mean()
    tight = StalenessRule(slots, max_skip=0.0, sample=500)
    tight.observe(w, inputs, rng, flat)
    tight.observe(moved, inputs, rng, flat)
    assert not tight.skippable(inputs).any()  # no skipping allowed: nothing skipped


def check_not_degenerate(rule: StalenessRule, inputs: np.ndarray, max_skip: float) -> None:
    """With a flat loss the cap must decide: it binds (the picked quantile is below the grid's top, so
    a larger threshold would skip too many popular inputs), and what it skips stays within the cap."""
    popular = (rule.slots[inputs] >= 0).all(axis=1)
    q = rule.picks[-1].quantile
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
        rule.observe(w, inputs, np.random.default_rng(0), flat)
        rule.observe(w + step, inputs, np.random.default_rng(0), flat)
        check_not_degenerate(rule, inputs, 0.3)
        thresholds.append(rule.threshold)
    assert thresholds[0] == pytest.approx(thresholds[1])

    old = StalenessRule(slots, max_skip=0.3, scale=0.05, sample=1000)  # the old rule: cap over all inputs
    old.observe(w, inputs, np.random.default_rng(0), flat)
    old.stale = np.ones(n_hot, bool)   # the top quantile of a rule whose cap never binds: every hot row stale
    old.threshold, old.picks = 1.0, [Pick(0.9, 1.0, 0.2, 1.0, "none")]
    with pytest.raises(AssertionError, match="degenerate"):
        check_not_degenerate(old, inputs, 0.3)


# ----- the threshold by the loss change it causes ----------------------------------------------------
def drifting_rows(rng: np.random.Generator, n_hot: int = 200):
    """Hot rows 0..99 barely move between two snapshots, rows 100..199 move a lot; popular inputs over
    all of them (and some cold ones). Returns (slots, inputs, snapshot, moved, calm): ``calm`` marks the
    inputs whose every row barely moved (the ones any useful threshold skips first)."""
    slots = hot_slots(np.arange(n_hot), 300)
    inputs = rng.integers(0, 220, (3000, 2))
    inputs[:600] = rng.integers(0, 100, (600, 2))  # enough popular inputs touching calm rows only
    w = rng.normal(size=(n_hot, 4)).astype(np.float32)
    moved = w.copy()
    moved[:100] += 0.001
    moved[100:] += rng.normal(size=(100, 4)).astype(np.float32)
    calm = (inputs < 100).all(axis=1)
    return slots, inputs, w, moved, calm


def picked(rule: StalenessRule, slots, inputs, w, moved, loss) -> Pick:
    rng = np.random.default_rng(7)
    rule.observe(w, inputs, rng, loss)
    rule.observe(moved, inputs, rng, loss)
    return rule.picks[-1]


def test_threshold_skipping_unlearned_inputs_is_rejected():
    """The calm inputs are the first any threshold skips. When the model has not learned them (their
    loss far above the sample's mean) every candidate that skips them is rejected by the loss rule, even
    though the skip cap would allow it; when they are learned (low loss) the same drift skips them up to
    the cap. The threshold follows the loss, not the drift alone."""
    slots, inputs, w, moved, calm = drifting_rows(np.random.default_rng(3))
    unlearned = lambda idx: np.where(calm[idx], 3.0, 0.5)  # noqa: E731
    learned = lambda idx: np.where(calm[idx], 0.1, 0.5)  # noqa: E731

    rule = StalenessRule(slots, max_skip=0.5, max_loss_increase=0.2, sample=800)
    pick = picked(rule, slots, inputs, w, moved, unlearned)
    assert pick.bound == "loss" and pick.skip_share == 0.0
    assert not rule.skippable(inputs).any()   # no calm input skipped: they still have much to learn

    rule = StalenessRule(slots, max_skip=0.5, max_loss_increase=0.2, sample=800)
    pick = picked(rule, slots, inputs, w, moved, learned)
    assert pick.skip_share > 0.2 and pick.loss_ratio < 1.0
    skipped = rule.skippable(inputs)
    popular = (slots[inputs] >= 0).all(axis=1)
    assert calm[skipped].mean() > calm[popular].mean()  # the calm inputs go first
    assert learned(np.flatnonzero(skipped)).mean() <= 1.2 * learned(np.flatnonzero(popular)).mean()

    cap_only = StalenessRule(slots, max_skip=0.5, max_loss_increase=10.0, sample=800)  # the loss never decides
    assert picked(cap_only, slots, inputs, w, moved, unlearned).skip_share > 0.2  # it would skip unlearned inputs
    with pytest.raises(AssertionError, match="loss far above"):
        check_rejects_unlearned(cap_only, inputs, unlearned)
    check_rejects_unlearned(StalenessRule(slots, max_skip=0.5, max_loss_increase=0.2, sample=800), inputs,
                            unlearned, observe=(w, moved))


def check_rejects_unlearned(rule: StalenessRule, inputs, loss, observe=None) -> None:
    """The inputs the rule skips must not have a loss far above the popular inputs' mean."""
    if observe is not None:
        picked(rule, rule.slots, inputs, *observe, loss)
    popular = np.flatnonzero((rule.slots[inputs] >= 0).all(axis=1))
    skipped = np.flatnonzero(rule.skippable(inputs))
    if len(skipped) and loss(skipped).mean() > 1.5 * loss(popular).mean():
        raise AssertionError("the threshold skips inputs with a loss far above the sample's mean")


def test_the_loss_tolerance_and_the_cap_are_both_honoured_and_recorded():
    slots, inputs, w, moved, calm = drifting_rows(np.random.default_rng(4))
    learned = lambda idx: np.where(calm[idx], 0.1, 0.5)  # noqa: E731
    tight = StalenessRule(slots, max_skip=0.05, max_loss_increase=0.2, sample=800)
    pick = picked(tight, slots, inputs, w, moved, learned)
    assert pick.bound in ("cap", "both") and 0 < pick.skip_share <= 0.05
    assert tight.probed == 800  # one probe of the sample per pick (the first observation only snapshots)
    with pytest.raises(ValueError, match="losses"):
        picked(StalenessRule(slots, max_skip=0.5), slots, inputs, w, moved, lambda idx: np.ones(3))


# ----- on a small trained setup ---------------------------------------------------------------------
def check_loss_driven(picks: list[Pick], max_loss_increase: float) -> None:
    """A threshold rule that is not degenerate: re-picked on every snapshot, it moves (not the same
    quantile every time), the loss rule decides some picks (the cap does not bind on every one), and
    no pick skips inputs whose loss exceeds the tolerance."""
    if len(picks) < 4:
        raise AssertionError(f"degenerate threshold: only {len(picks)} picks")
    if len({k.quantile for k in picks}) < 2:
        raise AssertionError(f"degenerate threshold: the same quantile {picks[0].quantile} at every pick")
    if not any(k.bound in ("loss", "both") for k in picks):
        raise AssertionError("degenerate threshold: the loss never decided a pick (the cap or the grid always did)")
    over = [k for k in picks if k.skip_share > 0 and k.loss_ratio > 1 + max_loss_increase + 1e-9]
    if over:
        raise AssertionError(f"degenerate threshold: {len(over)} picks skip inputs above the loss tolerance")


@pytest.fixture(scope="module")
def trained():
    """Slipstream trained on a small workload (two epochs, a pick every two steps), with the loss
    rule and with a tolerance it never reaches (the skip cap alone: the rule before the loss search)."""
    from dataclasses import replace

    from mlsys_flows.systems.recsys_embeddings import experiment as ex
    from mlsys_flows.systems.recsys_embeddings.trainer import train
    from mlsys_flows.systems.slipstream import Params

    p = Params.for_scale("smoke", samples=4096, test_samples=512, batch_size=256, epochs=2, snapshot_every=2,
                         stale_warmup=4, max_loss_increase=0.0)
    ds = ex.dataset(p)
    hot, _ = ex.hot_rows(ds, p)
    v = ex.variant("slipstream", p, hot)
    return p, train(ds, ex.config(p), v), train(ds, ex.config(p), replace(v, max_loss_increase=10.0))


def test_trained_threshold_is_loss_driven_and_not_degenerate(trained):
    p, r, cap_only = trained
    check_loss_driven(r.picks, p.max_loss_increase)
    c = r.counters
    assert c["stale_picks"] == len(r.picks) and 0 < c["skipped"] < r.samples
    assert sum(c[f"stale_bound_{b}"] for b in ("loss", "cap", "both", "none")) == len(r.picks)
    assert c["stale_bound_loss"] + c["stale_bound_both"] > 0
    popular = round(c["hot_input_fraction"] * p.samples)
    assert c["stale_probed"] == len(r.picks) * min(p.probe_samples, popular)  # the loss probe ran on the sample at every pick
    assert all(k.skip_share <= p.max_skip for k in r.picks)
    # the companion: with the loss out of the decision the same run's picks are degenerate
    with pytest.raises(AssertionError, match="degenerate"):
        check_loss_driven(cap_only.picks, 10.0)
