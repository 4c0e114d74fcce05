"""Verdicts with their intervals (systems/common/verdict.py; contract v4, issue 43 item 1)."""
from __future__ import annotations

import pytest

from mlsys_flows.systems.common import verdict as v


def test_three_pairs_all_above_one_are_a_tie():
    got = v.paired([1.0, 1.0, 1.0], [1.3, 1.4, 1.5], "higher")
    assert got.outcome == "ties" and got.interval is None and got.pairs == 3
    assert got.ratio == pytest.approx(1.4) and "fewer than 6" in got.label()


def test_six_pairs_all_above_one_win_with_an_interval_above_one():
    got = v.paired([10.0] * 6, [11.0, 12.0, 11.5, 13.0, 12.5, 11.8], "higher")
    assert got.outcome == "wins" and got.interval[0] > 1 and got.pairs == 6
    assert got.interval[0] <= got.ratio <= got.interval[1]


def test_a_lower_is_better_metric_loses_when_the_technique_takes_longer():
    got = v.paired([1.0] * 8, [1.2, 1.3, 1.25, 1.4, 1.22, 1.35, 1.28, 1.31], "lower")
    assert got.outcome == "loses" and got.interval[1] < 1


def test_an_interval_across_one_is_a_tie_whatever_the_median():
    """fluid's per-seed ratios against random dropout (issue 43): a median above 1, a tie."""
    base = [1.0] * 6
    got = v.paired(base, [1.15, 0.96, 1.28, 1.62, 1.03, 0.9], "higher")
    assert got.ratio > 1 and got.outcome == "ties" and got.interval[0] < 1 < got.interval[1]


def test_samples_that_are_not_independent_count_as_one_pair():
    got = v.paired([1.0] * 10, [2.0] * 10, "higher", independent=False)
    assert got.outcome == "ties" and got.pairs == 1 and "not independent" in got.why


def test_seven_pairs_with_one_clear_loss_tie():
    """A percentile bootstrap called this a win (1.01-1.05); the sign test's interval does not."""
    got = v.paired([1.0] * 7, [0.9, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06], "higher")
    assert got.outcome == "ties" and got.interval[0] < 1 < got.interval[1]


def test_the_interval_is_the_same_whichever_way_the_metric_is_better():
    base, tech = [10.0] * 7, [8.0, 7.5, 9.0, 8.2, 7.9, 8.8, 8.1]
    lower = v.paired(base, tech, "lower")
    higher = v.paired(tech, base, "higher")
    assert lower.outcome == higher.outcome == "wins"
    assert lower.ratio == pytest.approx(higher.ratio) and lower.interval == pytest.approx(higher.interval)


def test_no_difference_is_rarely_called_a_difference():
    """The interval keeps its level: with no true difference, a win or a loss in at most ~5% of draws."""
    import numpy as np

    rng = np.random.default_rng(7)
    for n in (6, 7, 8, 12):
        decided = sum(v.paired([1.0] * n, list(np.exp(rng.normal(0, 0.1, n))), "higher").outcome != "ties"
                      for _ in range(400))
        assert decided / 400 <= 0.07, (n, decided)


def test_a_deterministic_result_is_exact():
    got = v.exact(100.0, 80.0, "lower")  # counted: 80 items where the baseline needs 100
    assert got.exact and got.outcome == "wins" and got.interval is None and got.ratio == pytest.approx(1.25)
    assert got.label() == "wins 1.25x (exact)"
    assert v.exact(5.0, 5.0, "higher").outcome == "ties"


def test_unpaired_or_broken_samples_are_refused():
    with pytest.raises(ValueError, match="same, non-zero length"):
        v.paired([1.0, 2.0], [1.0], "higher")
    with pytest.raises(ValueError, match="no finite, positive ratio"):
        v.paired([0.0] * 6, [1.0] * 6, "higher")
