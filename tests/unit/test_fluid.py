"""FLuID: Invariant Dropout picks exactly the neurons below the threshold, re-expansion puts a
sub-model's update back at its own indices, FedAvg of identical updates is that update, and a
malformed or crashed client is excluded from its round with a reason. Each property check is also
shown to fail on a deliberately broken input."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.fluid import Config, Params, make_workload, plan_stragglers, run_federation
from mlsys_flows.systems.fluid import dropout as dr
from mlsys_flows.systems.fluid.model import accuracy, init_mlp, train_client

H = 12


def _net(seed=0, hidden=H):
    return init_mlp(64, hidden, 10, seed)


def _history(glob, layer1_small, layer2_small, clients=3, seed=1):
    """Non-straggler updates in which the listed neurons' weights (in, bias, out) change by 0.1% and
    every other weight by 10%: a crafted update history."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(clients):
        rel = [np.full(a.shape, 0.10) for a in glob]
        for j in layer1_small:
            rel[0][:, j] = rel[1][j] = 0.001
            rel[2][j, :] = 0.001
        for k in layer2_small:
            rel[2][:, k] = rel[3][k] = 0.001
            rel[4][k, :] = 0.001
        for j in layer1_small:  # W2 entries shared by a small neuron of layer 1 and a large one of layer 2
            rel[2][j, :] = 0.001
        sign = [rng.choice([-1.0, 1.0], a.shape) for a in glob]
        out.append([(g + s * r * np.where(g == 0, 1.0, np.abs(g))).astype(np.float32)
                    for g, s, r in zip(glob, sign, rel)])
    return out


def selection_ok(scores, theta, picked) -> bool:
    """The check: exactly the neurons whose score is below theta, ascending."""
    return list(picked) == [j for j, s in enumerate(scores) if s < theta]


def test_invariant_selection_on_crafted_history_picks_exactly_the_neurons_below_theta():
    glob = _net()
    glob[1][:] = 0.1  # nonzero biases so every weight's relative change is defined
    glob[3][:] = 0.1
    small1, small2 = [2, 5, 9], [0, 7]
    s1, s2 = dr.neuron_scores(glob, _history(glob, small1, small2))
    theta = 0.01
    assert dr.invariant_neurons(s1, theta).tolist() == small1
    assert selection_ok(s1, theta, dr.invariant_neurons(s1, theta))
    # layer-2 neuron scores include their incoming W2 rows shared with small layer-1 neurons: still above
    assert set(small2) <= set(dr.invariant_neurons(s2, theta).tolist())
    assert set(dr.invariant_neurons(s2, theta).tolist()) == set(small2)
    # the threshold search drops exactly the planned number, the most invariant ones, all below theta
    theta_found, dropped = dr.threshold_for_drop(s1, 3, 1e-5, 1.25)
    assert dropped.tolist() == small1 and all(s1[dropped] < theta_found)
    assert len(dr.invariant_neurons(s1, theta_found / 1.25)) < 3  # one search step earlier was not enough
    keep, thetas = dr.invariant_keep((s1, s2), 0.75, 1e-5, 1.25)
    assert keep[0].tolist() == [j for j in range(H) if j not in small1]
    # broken selections fail the check: <= instead of <, the top-scoring neurons, an off-by-one shift
    assert not selection_ok(s1, theta, np.argsort(-s1)[:3])
    assert not selection_ok(s1, theta, [j + 1 for j in small1])
    ties = np.array([0.5, 0.2, 0.2, 0.9])
    assert not selection_ok(ties, 0.2, np.flatnonzero(ties <= 0.2))
    assert selection_ok(ties, 0.2, dr.invariant_neurons(ties, 0.2))


def expansion_ok(full, sub, keep, base) -> bool:
    """The check: the sub-model's entries sit at its own indices, every other entry is the server's."""
    k1, k2 = keep
    inside = (np.array_equal(full[0][:, k1], sub[0]) and np.array_equal(full[1][k1], sub[1])
              and np.array_equal(full[2][np.ix_(k1, k2)], sub[2]) and np.array_equal(full[3][k2], sub[3])
              and np.array_equal(full[4][k2], sub[4]) and np.array_equal(full[5], sub[5]))
    d1 = np.setdiff1d(np.arange(base[0].shape[1]), k1)
    d2 = np.setdiff1d(np.arange(base[2].shape[1]), k2)
    outside = (np.array_equal(full[0][:, d1], base[0][:, d1]) and np.array_equal(full[2][d1], base[2][d1])
               and np.array_equal(full[2][:, d2], base[2][:, d2]) and np.array_equal(full[4][d2], base[4][d2]))
    return inside and outside


def test_reexpansion_puts_the_submodel_update_back_at_its_indices():
    base = _net()
    keep = (np.array([0, 3, 4, 8, 11]), np.array([1, 2, 6, 10]))
    sub = [a + 1.0 for a in dr.extract(base, keep)]  # a trained sub-model: every entry moved
    full, mask = dr.expand(sub, keep, base)
    assert expansion_ok(full, sub, keep, base)
    assert mask[0][:, keep[0]].all() and not mask[0][:, 1].any() and mask[2].sum() == 5 * 4
    # a shifted index mapping (each kept neuron written one place to the right) fails the check
    shifted = (np.minimum(keep[0] + 1, H - 1), keep[1])
    wrong, _ = dr.expand(sub, shifted, base)
    assert not expansion_ok(wrong, sub, keep, base)
    # extraction and expansion are inverse on the kept entries
    assert all(np.array_equal(a, b) for a, b in zip(dr.extract(full, keep), sub))


def test_fedavg_of_identical_updates_is_that_update_and_differs_otherwise():
    base, upd = _net(0), _net(1)
    ones = [np.ones(a.shape, bool) for a in base]
    agg = dr.aggregate(base, [(upd, ones, 30.0), (upd, ones, 70.0), (upd, ones, 5.0)])
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(agg, upd))
    # a partially trained (re-expanded) copy of the same update does not change it either
    keep = (np.arange(0, H, 2), np.arange(H // 2))
    full, mask = dr.expand(dr.extract(upd, keep), keep, base)
    agg = dr.aggregate(base, [(upd, ones, 10.0), (full, mask, 40.0)])
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(agg, upd))
    # entries nobody trained keep the server's weights
    agg = dr.aggregate(base, [(full, mask, 1.0)])
    assert np.array_equal(agg[0][:, 1], base[0][:, 1]) and np.allclose(agg[0][:, 0], upd[0][:, 0])
    # different updates average to something else
    other = _net(2)
    agg = dr.aggregate(base, [(upd, ones, 1.0), (other, ones, 1.0)])
    assert not all(np.allclose(a, b) for a, b in zip(agg, upd))
    assert np.allclose(agg[0], (upd[0].astype(np.float64) + other[0]) / 2, atol=1e-6)


def test_check_update_rejects_malformed_updates_with_a_reason():
    w = _net()
    shapes = [a.shape for a in w]
    dr.check_update(w, shapes)
    bad_nan = [a.copy() for a in w]
    bad_nan[2][1, 1] = np.nan
    bad_inf = [a.copy() for a in w]
    bad_inf[5][0] = np.inf
    for bad, why in ((bad_nan, "NaN/inf"), (bad_inf, "NaN/inf"), (w[:-1], "expected 6 arrays"),
                     ([w[0][:, :-1], *w[1:]], "shape"), (None, "NoneType"), ([*w[:5], [0.0] * 10], "not a numpy")):
        with pytest.raises(dr.UpdateError, match=why):
            dr.check_update(bad, shapes)


def _small():
    p = Params.for_scale("smoke", clients=5, hidden=16, rounds=2)
    w = make_workload(5, 0.5, 0.25, 1.0, 2.5, seed=3)
    plan = plan_stragglers(w, 16, 1, 0.2, 0.5, 10.0)
    cfg = Config(hidden=16, rounds=2, epochs=1, batch=16, lr=0.05, theta_init=1e-3, theta_growth=1.25,
                 comm_latency_s=0.0, bandwidth_mb_s=100.0, faulty_clients=3, seed=3)
    return p, w, plan, cfg


def test_malformed_and_crashed_clients_are_excluded_and_the_round_completes():
    _, w, plan, cfg = _small()
    seen: dict[int, list] = {}

    def run_clients(jobs):
        out = []
        for j in jobs:
            try:
                out.append(train_client(j))
            except RuntimeError as exc:
                out.append(exc)
        seen[jobs[0]["round"]] = out
        return out

    logs: list[str] = []
    h = run_federation(w, plan, cfg, "fedavg_wait", run_clients, log=logs.append)
    assert h.excluded[0] == []
    reasons = dict(h.excluded[1])
    assert sorted(reasons) == [0, 1, 2]  # NaN, raised error, wrong shapes
    assert "NaN/inf" in reasons[0] and reasons[1].startswith("task failed: RuntimeError") and "shape" in reasons[2]
    assert len(logs) == 3 and all("excluded" in line for line in logs)
    assert all(np.isfinite(a) for a in h.accuracy) and len(h.accuracy) == 2
    # the round's model equals FedAvg of the valid clients only ...
    start = _global_after_round0(w, cfg)
    valid = [(r["weights"], [np.ones(a.shape, bool) for a in r["weights"]], float(r["samples"]))
             for c, r in enumerate(seen[1]) if c >= 3]
    expected = dr.aggregate(start, valid)
    assert accuracy(expected, w.x_test, w.y_test) == h.accuracy[1]
    # ... and aggregating the malformed NaN update as well (no exclusion) poisons the model
    poisoned = dr.aggregate(start, valid + [(seen[1][0]["weights"], [np.ones(a.shape, bool) for a in start], 1.0)])
    assert not all(np.all(np.isfinite(a)) for a in poisoned)


def _global_after_round0(w, cfg):
    jobs = [{"weights": init_mlp(64, cfg.hidden, 10, cfg.seed), "x": x, "y": y, "epochs": cfg.epochs,
             "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed, "client": c, "round": 0, "fault": None}
            for c, (x, y) in enumerate(w.shards)]
    res = [train_client(j) for j in jobs]
    return dr.aggregate(init_mlp(64, cfg.hidden, 10, cfg.seed),
                        [(r["weights"], [np.ones(a.shape, bool) for a in r["weights"]], float(r["samples"])) for r in res])


def test_every_policy_runs_and_dropout_policies_send_stragglers_their_submodels():
    _, w, plan, cfg = _small()
    cfg = Config(**{**cfg.__dict__, "faulty_clients": 0, "rounds": 3})
    assert plan.stragglers and all(plan.r[c] < 1.0 for c in plan.stragglers)
    sizes: dict[str, list] = {}

    def run_clients(jobs):
        sizes.setdefault(policy, []).append({j["client"]: j["weights"][0].shape[1] for j in jobs})
        return [train_client(j) for j in jobs]

    for policy in ("fedavg_wait", "random_dropout", "ordered_dropout", "fluid"):
        h = run_federation(w, plan, cfg, policy, run_clients)
        assert len(h.accuracy) == 3 and h.excluded == [[], [], []]
        s = plan.stragglers[0]
        assert sizes[policy][0][s] == 16  # round 0: the full model everywhere
        assert sizes[policy][1][s] == (16 if policy == "fedavg_wait" else dr.keep_count(16, plan.r[s]))
        if policy == "fluid":
            assert all(np.isfinite(h.theta[1]))


def test_submodel_size_fits_the_needed_speedup():
    for need in (1.1, 1.3, 1.6, 2.0):
        r = dr.submodel_size(need, 64, 256, 10, 0.5)
        assert dr.flop_fraction(64, 256, 10, r) <= 1 / need
        if r < 1.0 and r + 0.05 <= 1.0:
            assert dr.flop_fraction(64, 256, 10, r + 0.05) > 1 / need  # the largest that fits
    assert dr.submodel_size(0.9, 64, 256, 10, 0.5) == 1.0
    assert dr.submodel_size(100.0, 64, 256, 10, 0.5) == 0.5


def test_workload_is_seeded_and_non_iid():
    a, b = make_workload(10, 0.3, 0.25, 1.0, 2.5, 7), make_workload(10, 0.3, 0.25, 1.0, 2.5, 7)
    assert all(np.array_equal(x[1], y[1]) for x, y in zip(a.shards, b.shards))
    assert np.array_equal(a.speed, b.speed) and a.speed.min() >= 1.0 and a.speed.max() <= 2.5
    assert sum(len(s[1]) for s in a.shards) + len(a.y_test) == 1797
    share = a.label_counts.max(1) / a.label_counts.sum(1)  # label skew: a dominant label per client
    assert np.median(share) > 0.2


def test_client_training_is_reproducible_and_faults_are_injected():
    _, w, _, cfg = _small()
    job = {"weights": _net(0, 16), "x": w.shards[3][0], "y": w.shards[3][1], "epochs": 1, "batch": 8, "lr": 0.05,
           "seed": 1, "client": 3, "round": 2, "fault": None}
    r1, r2 = train_client(job), train_client(job)
    assert all(np.array_equal(a, b) for a, b in zip(r1["weights"], r2["weights"])) and r1["cpu_s"] >= 0
    with pytest.raises(RuntimeError, match="injected"):
        train_client({**job, "fault": "raise"})
    assert np.isnan(train_client({**job, "fault": "nan"})["weights"][2]).any()


@pytest.mark.parametrize("bad,field", [(dict(speed_min=3.0, speed_max=2.0), "parameters"),
                                      (dict(faulty_clients=8), "parameters"), (dict(clients=1), "clients"),
                                      (dict(straggler_fraction=0.9), "straggler_fraction")])
def test_bad_parameters_fail_naming_the_field(bad, field):
    with pytest.raises(ParamsError) as e:
        Params.for_scale("smoke", **bad)
    assert e.value.field == field


def test_round_times_take_the_slowest_client_with_median_compute():
    from mlsys_flows.systems.fluid.federation import round_times

    speed = np.array([1.0, 2.0])
    trained = [[(0, 8, 1.0, 0.1), (1, 8, 1.0, 0.1)],   # client 1 (2x slower) sets the round: 2.1
               [(0, 8, 1.0, 0.1), (1, 4, 0.5, 0.05)],  # client 1 on a sub-model: client 0 sets it, 1.1
               [(0, 8, 9.0, 0.1), (1, 4, 0.5, 0.05)]]  # a 9 s spike of client 0: its median (1.0) is used
    robust, raw = round_times(trained, speed)
    assert robust == pytest.approx([2.1, 1.1, 1.1]) and raw == pytest.approx([2.1, 1.1, 9.1])
    assert round_times([[]], speed) == ([0.0], [0.0])  # every client excluded: an empty round


def test_slow_stragglers_slows_exactly_the_planned_stragglers_and_rescaling_retimes_them():
    from mlsys_flows.systems.fluid import rescale_stragglers, slow_stragglers

    w = make_workload(10, 0.5, 0.25, 1.0, 2.5, seed=4)
    slow = slow_stragglers(w, 16, 1, 0.2, 3.0)
    plan = plan_stragglers(slow, 16, 1, 0.2, 0.5, 10.0)
    changed = np.flatnonzero(slow.speed != w.speed).tolist()
    assert changed == plan.stragglers and len(changed) == 2
    assert np.allclose(slow.speed[changed], 3.0 * w.speed[changed])
    assert all(plan.r[c] < 1.0 for c in plan.stragglers)  # 3x slower: they get sub-models
    back = rescale_stragglers(slow.speed, plan.stragglers, 1 / 3.0)
    assert np.allclose(back, w.speed) and np.allclose(slow_stragglers(w, 16, 1, 0.2, 1.0).speed, w.speed)
    with pytest.raises(ValueError):
        slow_stragglers(w, 16, 1, 0.2, 0.5)
