"""SwiftMoE review (issue 13): the DeepSpeed capacity-factor sweep, re-pricing recorded work for
other links and expert sizes."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mlsys_flows.systems.moe.model import MoEConfig, TinyMoE, initial_experts
from mlsys_flows.systems.swiftmoe import CAPACITY_SWEEP, DEEPSPEED_SWEEP, SPEC, VARIANTS, Params, variant_policy
from mlsys_flows.systems.swiftmoe.cost import Profile, TimeModel, reprice, sweep_flexmoe_ratio, time_to_target
from mlsys_flows.systems.swiftmoe.policies import IterationWork, make_policy
from mlsys_flows.systems.swiftmoe.train import build_workload, train_policy

CFG = MoEConfig(vocab=64, d_model=16, n_heads=2, n_layers=2, n_experts=4, d_ff=32, top_k=1, seq_len=8)


# ---- capacity-factor sweep ------------------------------------------------------------------------
def test_sweep_variants_are_deepspeed_baselines():
    assert set(DEEPSPEED_SWEEP) <= set(SPEC.baselines) and "deepspeed" in SPEC.baselines
    assert set(VARIANTS) == {"deepspeed", "flexmoe", "swiftmoe", *DEEPSPEED_SWEEP, "swiftmoe_frozen", "flexmoe_every",
                             "deepspeed_tuned"}
    assert all(SPEC.role(v) == ("oracle",) for v in DEEPSPEED_SWEEP)  # swept on the evaluated trace: hindsight
    assert [variant_policy(v, 1.0) for v in DEEPSPEED_SWEEP] == [("deepspeed", cf) for cf in CAPACITY_SWEEP]
    assert variant_policy("deepspeed", 1.7) == ("deepspeed", 1.7)  # the paper's baseline keeps the param
    with pytest.raises(ValueError, match="unknown variant"):
        variant_policy("deepspeed_cf9", 1.0)


def _drops_fall(cfs: list[float], dropped: list[int]) -> bool:
    """More capacity never drops more tokens, and the largest capacity drops strictly fewer."""
    order = np.argsort(cfs)
    d = np.asarray(dropped)[order]
    return bool(np.all(np.diff(d) <= 0) and d[-1] < d[0])


def _dropped_at(cf: float) -> int:
    """Tokens DeepSpeed drops at capacity factor ``cf`` in one forward of the same model and batch."""
    model = TinyMoE(CFG, seed=0)
    pol = make_policy("deepspeed", CFG, initial_experts(CFG, 0), 2, 2, 1e-2, cf, 1)
    tokens = torch.as_tensor(build_workload(Params.for_scale("smoke", vocab=64, regimes=4, seq_len=8, batch=8,
                                                             workers=2, n_experts=4, slots_per_worker=2,
                                                             iterations=5, n_eval=4)).train[0])
    with torch.no_grad():
        model(tokens[:, :-1], pol)
    assert pol.work.routed == tokens.shape[0] * CFG.seq_len * CFG.top_k * CFG.n_layers  # every routed row counted
    return pol.work.dropped


def test_each_capacity_factor_drops_fewer_tokens():
    cfs = [1.0, *CAPACITY_SWEEP]
    dropped = [_dropped_at(cf) for cf in cfs]
    assert dropped[0] > 0, "the tiny batch must overflow at cf 1.0 for the check to mean anything"
    assert _drops_fall(cfs, dropped), dropped


def test_drop_check_fails_on_broken_sweep():
    cfs = [1.0, *CAPACITY_SWEEP]
    dropped = [_dropped_at(cf) for cf in cfs]
    assert not _drops_fall(cfs, dropped[::-1])      # capacities paired with the wrong counts
    assert not _drops_fall(cfs, [dropped[0]] * 4)   # a sweep that ignores the capacity factor


# ---- re-pricing recorded work -----------------------------------------------------------------------
PROF = Profile(rows=[1, 2], expert_s=[1.0, 1.0], call_s=0.5, row_s=0.01, dense_s=2.0, dense_bytes=1000, device="cpu")


def _tiny_trace() -> list[dict]:
    """Two iterations of hand-written work on 2 workers, 1 MoE layer (d_model 4)."""
    a = IterationWork(layers=1, workers=2)
    a.compute[0] = [(0, 10), (1, 30), (1, 20)]
    a.a2a_rows[0] = np.array([[6.0, 4.0], [1.0, 29.0]])
    a.add_bytes("grad_reduce_scatter", 0, 1, 300.0)
    a.add_bytes("weight_all_gather", 1, 0, 200.0)
    b = IterationWork(layers=1, workers=2)
    b.compute[0] = [(0, 5)]
    b.a2a_rows[0] = np.array([[0.0, 0.0], [5.0, 0.0]])
    b.add_bytes("migration", 0, 1, 800.0)
    b.add_bytes("grad_allreduce", 1, 0, 100.0)
    return [a.to_trace(), b.to_trace()]


def _independent(bw: float, scale: float) -> list[float]:
    """The same two iterations priced by hand (bw in bytes/s): dense + dense all-reduce
    (2(W-1)/W x bytes) + slowest worker's calls + 4 all-to-all passes of fp32 rows x d_model +
    each phase's busiest link, expert-state phases scaled."""
    dense = 2.0 + 1000 / bw
    it1 = dense + max(0.5 + 0.1, (0.5 + 0.3) + (0.5 + 0.2)) + 4 * max(4, 1) * 4 * 4 / bw + scale * (300 + 200) / bw
    it2 = dense + (0.5 + 0.05) + 4 * 5 * 4 * 4 / bw + scale * (800 + 100) / bw
    return [it1, it2]


def _agrees(price) -> bool:
    """``price(trace, link_gbps, scale)`` agrees with the hand computation at several settings."""
    return all(np.allclose(price(_tiny_trace(), g, s), _independent(g * 1e9 / 8, s), rtol=1e-12, atol=0)
               for g in (1e-6, 1e-5, 1e-3) for s in (1.0, 10.0))


def test_reprice_matches_independent_computation():
    assert _agrees(lambda tr, g, s: reprice(tr, PROF, g, d_model=4, workers=2, state_scale=s))
    times = reprice(_tiny_trace(), PROF, 1e-5, 4, 2)
    assert time_to_target(times, 1) == times[0] and time_to_target(times, 2) == pytest.approx(sum(times))


def test_reprice_check_fails_on_broken_pricing():
    def ignores_scale(tr, g, s):  # prices every phase at its real size
        return reprice(tr, PROF, g, 4, 2, 1.0)

    def drops_migration(tr, g, s):
        for t in tr:
            t["comm"].pop("migration", None)
        return reprice(tr, PROF, g, 4, 2, s)

    assert not _agrees(ignores_scale)
    assert not _agrees(drops_migration)
    bad = _tiny_trace()
    bad[0]["a2a_rows"][0] = np.zeros((3, 3))  # a matrix for the wrong worker count
    with pytest.raises(ValueError, match="shape"):
        reprice(bad, PROF, 1.0, 4, 2)
    with pytest.raises(ValueError, match="iterations_to_target"):
        time_to_target([1.0, 2.0], 3)


def test_sweep_ratio_is_flexmoe_over_swiftmoe_time_to_target():
    flex, swift = _tiny_trace(), _tiny_trace()[:1] * 2
    out = sweep_flexmoe_ratio({"trace": flex, "iterations_to_target": 2}, {"trace": swift, "iterations_to_target": 1},
                              PROF, 4, 2, [1e-5, 1e-3], [1.0, 10.0])
    for s in (1.0, 10.0):
        for i, g in enumerate((1e-5, 1e-3)):
            want = sum(_independent(g * 1e9 / 8, s)) / _independent(g * 1e9 / 8, s)[0]
            assert out[s][i] == pytest.approx(want, rel=1e-12)


def test_recorded_trace_reprices_to_the_training_clock():
    """Re-pricing a real run's trace at the run's own link gives back its per-iteration clock."""
    torch.set_num_threads(1)
    p = Params.for_scale("smoke", iterations=5, eval_every=5, batch=8, seq_len=8, n_eval=4, d_model=16, d_ff=32)
    for name in ("flexmoe", "swiftmoe"):
        run = train_policy(name, p, build_workload(p), PROF, record=True)
        assert len(run.trace) == p.iterations
        np.testing.assert_allclose(reprice(run.trace, PROF, p.link_gbps, p.d_model, p.workers, precision=p.precision),
                                   run.iter_time_s, rtol=1e-12)
        slower = reprice(run.trace, PROF, p.link_gbps, p.d_model, p.workers, state_scale=100.0, precision=p.precision)
        assert all(b > a for a, b in zip(run.iter_time_s, slower))  # every iteration syncs expert state

# the gloo calibration (2 ranks on Dask worker processes): tests/integration/test_ranks.py
