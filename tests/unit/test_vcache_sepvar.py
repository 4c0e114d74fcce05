"""vCache: the variance used for perfectly separated observations is our own calibration. The pinned
table SEPARABLE_MSE is what simulate_separable_error computes (two entries recomputed here, the full
table by derive_separable_variance in about 8 s), and the curve A n^-B the fit uses is the power-law
fit through that table. The near-duplicate sphere stream keeps its shape."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.vcache import sphere_stream
from mlsys_flows.systems.vcache.cache import (SEPARABLE_MSE, SEPARABLE_VAR_A, SEPARABLE_VAR_B, fit_power_law,
                                              separable_variance, simulate_separable_error)


@pytest.mark.parametrize("n", [6, 64])
def test_pinned_separable_table_is_the_simulation(n):
    assert simulate_separable_error(n, reps=1000, seed=0) == pytest.approx(SEPARABLE_MSE[n], rel=2e-3)


def test_variance_curve_is_the_power_law_through_the_table():
    a, b = fit_power_law(SEPARABLE_MSE)
    assert (a, b) == (SEPARABLE_VAR_A, SEPARABLE_VAR_B)
    assert 0.5 < b < 1.5  # shrinks roughly like 1/n
    for n, mse in SEPARABLE_MSE.items():
        assert separable_variance(n) == pytest.approx(mse, rel=0.35)
    assert separable_variance(200) < separable_variance(6)


def test_simulation_rejects_too_few_observations():
    with pytest.raises(ValueError, match="n must be"):
        simulate_separable_error(2)


def test_near_duplicates_share_zero_is_the_plain_stream_and_twins_collide():
    plain = sphere_stream(3000, 300, 32, 5, 0.15, 1.0, 0.6, 0.9, 4)
    same = sphere_stream(3000, 300, 32, 5, 0.15, 1.0, 0.6, 0.9, 4, near_dup_share=0.0)
    assert np.array_equal(plain.vectors, same.vectors) and np.array_equal(plain.labels, same.labels)
    twins = sphere_stream(3000, 300, 32, 5, 0.15, 1.0, 0.6, 0.9, 4, near_dup_share=0.3)

    def wrong_nearest(st):
        """Share of prompts whose nearest other prompt (similarity >= 0.95) has another class."""
        sims = st.vectors @ st.vectors.T
        np.fill_diagonal(sims, -1)
        j = sims.argmax(1)
        close = sims[np.arange(len(j)), j] >= 0.95
        return float(np.mean(st.labels[j][close] != st.labels[close]))

    # near-duplicates whose answers differ: more very close neighbours carry another answer
    assert wrong_nearest(twins) > 2 * wrong_nearest(plain) + 0.01
    with pytest.raises(ValueError, match="near_dup_share"):
        sphere_stream(100, 10, 8, 5, 0.15, 1.0, 0.6, 0.9, 0, near_dup_share=1.0)
