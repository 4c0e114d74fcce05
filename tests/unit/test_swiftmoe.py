"""SwiftMoE: sharded-optimizer equivalence, real token dropping, placement, workload, time model (pure)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.moe.model import LocalExperts, MoEConfig, TinyMoE, initial_experts, lm_loss
from mlsys_flows.systems.swiftmoe import Params
from mlsys_flows.systems.swiftmoe.cost import Profile, TimeModel, fit_linear, phase_seconds
from mlsys_flows.systems.swiftmoe.placement import assign_workers, replica_counts
from mlsys_flows.systems.swiftmoe.policies import IterationWork, make_policy
from mlsys_flows.systems.swiftmoe.workload import make_workload, regime_mix

CFG = MoEConfig(vocab=64, d_model=16, n_heads=2, n_layers=2, n_experts=4, d_ff=32, top_k=1, seq_len=8)
LR = 1e-2
# Replicas and shards sum fp32 gradients in another order than the reference's one matmul per
# expert. Adam normalizes each update (|step| <= ~LR per element), so where a gradient nearly
# cancels, a rounding difference moves a weight by a sizeable share of LR, not by ~1e-7: with one
# torch thread a weight differed by 1.13e-5 after 6 steps. The bound: 0.1% of the largest total
# movement Adam allows, LR per step, over the training steps.
def atol(steps: int) -> float:
    return 1e-3 * LR * steps


def _train(cfg: MoEConfig, backend, batches) -> list[list[torch.Tensor]]:
    model = TinyMoE(cfg, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    choices = []
    for b in batches:
        logits, ch = model(b[:, :-1], backend)
        lm_loss(logits, b[:, 1:]).backward()
        opt.step()
        opt.zero_grad()
        backend.step()
        choices.append(ch)
    return choices


@pytest.mark.parametrize("name,workers,slots,top_k", [("swiftmoe", 4, 2, 1), ("swiftmoe", 8, 1, 2), ("flexmoe", 4, 2, 1)])
def test_sharded_training_equals_single_process_reference(name, workers, slots, top_k):
    cfg = MoEConfig(**{**CFG.__dict__, "top_k": top_k})
    wl = make_workload(cfg.vocab, 4, 3, 3.0, 8, 6, 8, cfg.seq_len, 4, 4, seed=3)
    batches = [torch.as_tensor(b) for b in wl.train]
    weights = initial_experts(cfg, seed=1)
    ref = LocalExperts(cfg, weights, LR)
    pol = make_policy(name, cfg, weights, workers, slots, LR, capacity_factor=1.0, replace_every=3)
    placements, moved = [], 0.0
    step = pol.step

    def recording_step():  # watch the placement change and the bytes moved while training
        nonlocal moved
        work = step()
        moved += sum(float(m.sum()) for m in work.comm.values())
        placements.append([sorted(r) for r in pol.replicas[0]])
        return work

    pol.step = recording_step
    ref_choices, pol_choices = _train(cfg, ref, batches), _train(cfg, pol, batches)
    for a, b in zip(ref_choices, pol_choices):  # the same token assignment at every step
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    for ref_layer, pol_layer, init_layer in zip(ref.expert_weights(), pol.expert_weights(), weights):
        for r, p, w0 in zip(ref_layer, pol_layer, init_layer):
            torch.testing.assert_close(p, r, atol=atol(len(batches)), rtol=0)
            assert (r - w0).abs().max() > 1e-3  # the expert really trained
    assert len({str(pl) for pl in placements}) > 1  # replicas really moved between workers
    assert moved > 0


def test_deepspeed_overflow_rows_are_dropped_and_get_no_gradient():
    cfg = CFG
    pol = make_policy("deepspeed", cfg, initial_experts(cfg, 0), workers=2, slots_per_worker=2, lr=LR,
                      capacity_factor=1.0, replace_every=1)
    n = 16  # 8 tokens per worker -> capacity ceil(1.0 * 8 / 4) = 2 rows per (worker, expert)
    x = torch.randn(n, cfg.d_model, requires_grad=True)
    expert = torch.tensor([0] * 6 + [1] * 2 + [2] * 8)  # worker 0: 6x e0, 2x e1; worker 1: 8x e2
    out = pol(0, x, expert, n)
    kept = [0, 1, 6, 7, 8, 9]
    dropped = [i for i in range(n) if i not in kept]
    assert out[dropped].abs().sum() == 0 and (out[kept].abs().sum(1) > 0).all()
    out.sum().backward()
    assert x.grad[dropped].abs().sum() == 0 and (x.grad[kept].abs().sum(1) > 0).all()
    assert pol.work.dropped == len(dropped) and pol.work.routed == n
    assert pol.work.compute[0] and all(rows == 2 * 2 for _, rows in pol.work.compute[0])  # padded buffers


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=2, max_size=12), st.integers(1, 4), st.integers(2, 8))
def test_placement_respects_slots_and_follows_load(load, slots_per_worker, workers):
    e = len(load)
    slots = workers * slots_per_worker
    if slots < e:
        with pytest.raises(ValueError):
            replica_counts(load, slots, workers)
        return
    counts = replica_counts(load, slots, workers)
    assert counts.min() >= 1 and counts.max() <= workers and counts.sum() == min(slots, e * workers)
    order = np.argsort(load)
    assert all(counts[order[i]] <= counts[order[j]] for i in range(e) for j in range(i + 1, e)
               if load[order[i]] < load[order[j]])  # more load never means fewer replicas
    held = assign_workers(np.asarray(load), counts, workers, slots_per_worker)
    assert all(len(h) <= slots_per_worker and len(set(h)) == len(h) for h in held)
    assert [sum(x in h for h in held) for x in range(e)] == counts.tolist()


@pytest.mark.parametrize("field,value", [("capacity_factor", 0), ("workers", 1), ("top_k", 3), ("iterations", 10**9)])
def test_bad_params_name_the_field(field, value):
    with pytest.raises(ParamsError, match=field):
        Params.for_scale("smoke", **{field: value})


def test_cross_field_checks_fail_before_work():
    with pytest.raises(ParamsError, match="workers"):
        Params.for_scale("quick", workers=3)
    with pytest.raises(ParamsError, match="slots_per_worker"):
        Params.for_scale("quick", workers=2, n_experts=8, slots_per_worker=1)


def test_workload_is_skewed_drifting_and_regime_local():
    mix = regime_mix(np.arange(100), 8, 2.0, 100)
    np.testing.assert_allclose(mix.sum(1), 1)
    assert mix.max(1).min() > 2 / 8  # skewed at every iteration
    assert len(set(mix.argmax(1))) == 8  # the popular regime rotates through all
    np.testing.assert_allclose(regime_mix(5, 8, 0.0, 100), np.full(8, 1 / 8))
    wl = make_workload(64, 4, 3, 2.0, 40, 6, 8, 15, 8, 4, seed=0)
    assert wl.train.shape == (6, 8, 16) and wl.eval.shape == (4, 16)
    blocks = wl.train.reshape(-1, 2, 8) // 16  # two 8-token segments per sequence, 16 tokens per regime
    assert (blocks == blocks[:, :, :1]).all()  # a segment never leaves its regime
    assert 0 < wl.bayes_loss < np.log(64)


def test_time_model_charges_slowest_worker_and_busiest_link():
    assert fit_linear([1, 10, 100], [1.1, 2.0, 11.0]) == pytest.approx((1.0, 0.1))
    prof = Profile(rows=[1, 2], expert_s=[1.0, 1.0], call_s=0.5, row_s=0.01, dense_s=2.0, dense_bytes=0, device="cpu")
    assert prof.expert_time(0) == 0 and prof.expert_time(100) == pytest.approx(1.5)
    m = np.array([[5.0, 4.0], [1.0, 0.0]])
    assert phase_seconds(m, 2.0) == 2.0  # worker 0 sends 4 bytes (the diagonal stays local)
    work = IterationWork(layers=1, workers=2)
    work.compute[0] = [(0, 100), (0, 100), (1, 10)]
    work.add_bytes("migration", 0, 1, 1e9 / 8)
    t = TimeModel(prof, link_gbps=1.0, d_model=4, workers=2).iteration(work)
    assert t["expert_compute"] == pytest.approx(3.0) and t["migration"] == pytest.approx(1.0)
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"))


def test_evaluation_is_not_training_work():
    pol = make_policy("swiftmoe", CFG, initial_experts(CFG, 0), 4, 2, LR, 1.0, 1)
    model = TinyMoE(CFG, seed=0)
    tokens = torch.randint(0, CFG.vocab, (4, CFG.seq_len + 1))
    model(tokens[:, :-1], pol)
    before = (pol.work.routed, [list(c) for c in pol.work.compute], pol.load.copy())
    with torch.no_grad(), pol.evaluating():
        model(tokens[:, :-1], pol)
    assert (pol.work.routed, [list(c) for c in pol.work.compute]) == before[:2]
    np.testing.assert_array_equal(pol.load, before[2])


# --- contract v3: the frozen-placement ablation, the calibrated capacity factor, the drift regime -----------

def test_frozen_swiftmoe_trains_the_same_update_on_a_fixed_placement():
    wl = make_workload(CFG.vocab, 4, 3, 3.0, 8, 6, 8, CFG.seq_len, 4, 4, seed=3)
    batches = [torch.as_tensor(b) for b in wl.train]
    weights = initial_experts(CFG, seed=1)
    ref = LocalExperts(CFG, weights, LR)
    pol = make_policy("swiftmoe_frozen", CFG, weights, 4, 2, LR, capacity_factor=1.0, replace_every=3)
    start = [[sorted(r) for r in layer] for layer in pol.replicas]
    _train(CFG, ref, batches), _train(CFG, pol, batches)
    assert [[sorted(r) for r in layer] for layer in pol.replicas] == start   # never re-placed
    for ref_layer, pol_layer in zip(ref.expert_weights(), pol.expert_weights()):
        for r, p in zip(ref_layer, pol_layer):
            torch.testing.assert_close(p, r, atol=atol(len(batches)), rtol=0)
    live = make_policy("swiftmoe", CFG, weights, 4, 2, LR, capacity_factor=1.0, replace_every=3)
    _train(CFG, live, batches)
    assert [[sorted(r) for r in layer] for layer in live.replicas] != start  # the technique does re-place


def test_capacity_choice_and_regime_params():
    from mlsys_flows.systems.swiftmoe import TUNED, choose_capacity, variant_policy

    def runs(**times):
        return {float(k[2:].replace("_", ".")): {"time_to_target_s": t, "reached_target": float(r)}
                for k, (t, r) in times.items()}

    assert choose_capacity(runs(cf1=(0.9, 1), cf1_25=(0.7, 1), cf1_5=(0.7, 1), cf2=(0.8, 1))) == 1.25
    # a run that missed the target reports its total time, a lower bound: it never wins
    assert choose_capacity(runs(cf1=(0.5, 0), cf1_25=(0.7, 1), cf2=(0.6, 1))) == 2.0
    assert variant_policy(TUNED, 1.5) == ("deepspeed", 1.5)
    p = Params.for_scale("quick")
    assert p.drift_rate == 1.0 and p.regime_drift_rates == [0.0, 1.0, 2.5, 5.0]
    small = p.at_drift(2.5)
    assert small.drift_period == 40.0 and small.iterations == Params.for_scale("smoke").iterations
    assert small.seed == p.seed and p.at_drift(0.0).drift_period == float("inf")
    assert p.calibration().seed != p.seed and p.calibration().iterations == p.iterations
    s = Params.for_scale("smoke")
    assert s.at_drift(s.drift_rate) == s   # the smoke regime reuses the run at its own drift
    # no drift: the same regime mix at every iteration; drift: it moves
    mix = regime_mix(np.arange(3), 4, 2.0, float("inf"))
    assert np.allclose(mix[0], mix[2]) and not np.allclose(*regime_mix(np.array([0, 20]), 4, 2.0, 40.0))
    with pytest.raises(ParamsError):
        Params.for_scale("smoke", regime_drift_rates=[1.0, 1.0])


def test_a_regime_point_where_a_compared_side_missed_the_target_is_invalid():
    """Time to target is a lower bound for a policy that missed the target: such a point stays out of the
    crossover, whether SwiftMoE or the strongest deployable baseline missed it."""
    from mlsys_flows.systems.swiftmoe.result import _regime_point

    def runs(swift_reached, flex_reached):
        return {"deepspeed_tuned": {"time_to_target_s": 3.0, "reached_target": 1.0},
                "flexmoe": {"time_to_target_s": 2.0, "reached_target": flex_reached},
                "swiftmoe": {"time_to_target_s": 1.9, "reached_target": swift_reached},
                "swiftmoe_frozen": {"time_to_target_s": 2.5, "reached_target": 0.0}}

    assert _regime_point(1.0, runs(1.0, 1.0)).valid  # the ablation is not a compared baseline
    broken = _regime_point(1.0, runs(1.0, 0.0))
    assert not broken.valid and "flexmoe missed the target" in broken.invalid
    assert not _regime_point(1.0, runs(0.0, 1.0)).valid
