"""The shared embedding-access workload: calibrated skew, coverage, pooling."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.embeddings import (calibrated_exponent, make_table, sample_ids, top_share,
                                                   zipf_weights)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(200, 200_000), frac=st.floats(0.01, 0.3), share=st.floats(0.4, 0.95))
def test_calibrated_exponent_hits_the_asked_skew(n, frac, share):
    s = calibrated_exponent(n, frac, share)
    if s < 8.0:  # otherwise the table is too small for that skew
        assert top_share(zipf_weights(n, s), frac) == pytest.approx(share, abs=2e-3)


def test_sampled_trace_has_the_papers_skew_coverage_and_pooling():
    rng = np.random.default_rng(0)
    table = make_table("t", rows=50_000, dim=8, pooling=12.0, coverage=0.4, rng=rng)
    assert table.coverage == pytest.approx(0.4)
    ids, lengths = sample_ids(table, batch=20_000, rng=rng)
    assert lengths.min() >= 1 and lengths.mean() == pytest.approx(12.0, rel=0.02)
    assert len(ids) == lengths.sum() and ids.min() >= 0 and ids.max() < table.rows
    assert np.all(table.probs[ids] > 0)  # never a row that hashing leaves untouched
    counts = np.bincount(ids, minlength=table.rows)
    reachable = np.sort(counts[table.probs > 0])[::-1]
    hot = int(np.ceil(0.07 * len(reachable)))
    assert reachable[:hot].sum() / reachable.sum() == pytest.approx(0.76, abs=0.02)


def test_bad_calibration_targets_are_refused():
    with pytest.raises(ValueError, match="hot_fraction"):
        calibrated_exponent(100, 0.0, 0.5)
