"""FLuID's dynamic adaptation: client speeds change between rounds (busy spells), the stragglers and
their sub-model sizes are re-detected from what the server saw of the previous round (never from the
round about to run), every policy of a seed sees the same speeds, stragglers and sizes, and with
speeds that never change the re-detecting FLuID is exactly the one with stragglers fixed from the profile."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_flows.systems.common.params import ParamsError
from mlsys_flows.systems.fluid import (POLICIES, Config, Params, full_model_estimate, make_workload,
                                       observed_s, plan_from_estimates, plan_stragglers, redetects,
                                       rescale_stragglers, round_times, run_federation, slow_stragglers,
                                       speed_trajectory, with_trajectory)
from mlsys_flows.systems.fluid import dropout as dr
from mlsys_flows.systems.fluid.federation import profile_flops
from mlsys_flows.systems.fluid.model import train_client

H, CLIENTS, ROUNDS = 16, 5, 7


def _cfg(**over) -> Config:
    base = dict(hidden=H, rounds=ROUNDS, epochs=1, batch=16, lr=0.05, theta_init=1e-3, theta_growth=1.25,
                comm_latency_s=0.0, bandwidth_mb_s=100.0, faulty_clients=0, seed=3, straggler_fraction=0.2,
                min_r=0.5, ref_gflops=10.0, redetect_every=1)
    return Config(**{**base, **over})


def _workload():
    w = slow_stragglers(make_workload(CLIENTS, 0.5, 0.25, 1.0, 2.5, seed=3), H, 1, 0.2, 1.5)
    return w, plan_stragglers(w, H, 1, 0.2, 0.5, 10.0)


def _run(w, plan, cfg, policy, sizes=None):
    def run_clients(jobs):
        if sizes is not None:
            sizes.append({j["client"]: j["weights"][0].shape[1] for j in jobs})
        out = []
        for j in jobs:
            try:
                out.append(train_client(j))
            except RuntimeError as exc:  # an injected crash: excluded from its round
                out.append(exc)
        return out
    return run_federation(w, plan, cfg, policy, run_clients)


def _profile_plan_from(w, speed_row):
    """The plan a server would make from one round's full-model times at ``speed_row``."""
    return plan_from_estimates(profile_flops(w, H, 1) * np.asarray(speed_row) / 10.0e9, H, 0.2, 0.5)


def test_speed_trajectory_is_seeded_starts_at_the_profile_and_has_busy_spells_of_the_stated_length():
    speed = np.linspace(1.0, 2.5, 12)
    a = speed_trajectory(speed, 40, 0.1, 2.0, 4, seed=5)
    assert a.shape == (40, 12) and np.array_equal(a, speed_trajectory(speed, 40, 0.1, 2.0, 4, seed=5))
    assert not np.array_equal(a, speed_trajectory(speed, 40, 0.1, 2.0, 4, seed=6))
    assert np.array_equal(a[0], speed)  # round 0 is the profile
    busy = a > speed * (1 + 1e-9)
    assert np.allclose(a[busy], np.broadcast_to(2.0 * speed, a.shape)[busy])  # busy: exactly busy_slowdown slower
    assert np.allclose(a[~busy], np.broadcast_to(speed, a.shape)[~busy])
    assert 0 < busy.sum() < busy.size
    for c in range(12):  # every busy run that ends before the last round lasts a multiple of busy_rounds
        runs, n = [], 0
        for t in range(40):
            if busy[t, c]:
                n += 1
            elif n:
                runs.append(n)
                n = 0
        assert all(r % 4 == 0 for r in runs)
    # no busy spells: the profile in every round; the same draws whatever the probability
    assert np.array_equal(speed_trajectory(speed, 40, 0.0, 2.0, 4, seed=5), np.tile(speed, (40, 1)))
    more = speed_trajectory(speed, 40, 0.3, 2.0, 4, seed=5) > speed * (1 + 1e-9)
    assert busy.sum() < more.sum()
    with pytest.raises(ValueError):
        speed_trajectory(speed, 40, 1.5, 2.0, 4, seed=5)


def test_the_server_estimate_recovers_full_model_time_from_a_submodel_round():
    f, s = 3.0e9, 1.7
    full = observed_s(f, H, H, s, 10.0)
    assert full == f * s / 10.0e9
    for kept in (8, 11, 15):
        seen = observed_s(f, kept, H, s, 10.0)
        assert seen < full  # a sub-model round is shorter ...
        assert full_model_estimate(seen, kept, H) == pytest.approx(full, rel=1e-12)  # ... and normalised back
    # normalising by r alone (the share of neurons, not of FLOPs) would get it wrong
    assert abs(observed_s(f, 8, H, s, 10.0) / (8 / H) - full) > 1e-3 * full


def test_stragglers_are_redetected_from_the_previous_round_never_from_the_round_about_to_run():
    w, plan = _workload()
    x = next(c for c in range(CLIENTS) if c not in plan.stragglers)  # a non-straggler of the profile ...
    traj = np.tile(w.speed, (ROUNDS, 1))
    traj[3:5, x] *= 10.0  # ... becomes busy (10x slower) in rounds 3 and 4 only
    dyn = with_trajectory(w, traj)
    h = _run(dyn, plan, _cfg(), "fluid")
    assert x in _profile_plan_from(w, traj[3]).stragglers  # a detector that saw round 3's own speeds would pick x
    assert [x in s for s in h.stragglers] == [False, False, False, False, True, True, False]
    assert h.stragglers[1] == plan.stragglers  # round 1: planned from round 0, i.e. the profile
    assert h.stragglers[4] == _profile_plan_from(w, traj[3]).stragglers  # round 4: from round 3's observations
    assert h.r[4] == [_profile_plan_from(w, traj[3]).r[c] for c in h.stragglers[4]]
    # the recorded speeds are the trajectory, and each round is timed at its own speeds
    assert np.array_equal(np.asarray(h.speed), traj)
    assert h.round_s == pytest.approx(round_times(h.trained, traj)[0])
    kept = [{c: k for c, k, _, _ in d} for d in h.trained]
    assert kept[3][x] == H and kept[4][x] < H and kept[6][x] == H  # x's sub-model: the rounds after it was seen slow
    # fixed stragglers (fluid_static) never react: x trains the full model while busy
    hs = _run(dyn, plan, _cfg(), "fluid_static")
    assert all(s == plan.stragglers for s in hs.stragglers)
    assert all(k == H for d in hs.trained for c, k, _, _ in d if c == x)


def test_redetect_every_k_replans_only_at_rounds_1_1_plus_k_and_so_on():
    cfg = _cfg(redetect_every=3)
    assert [t for t in range(10) if redetects(cfg, "fluid", t)] == [1, 4, 7]
    assert [t for t in range(10) if redetects(_cfg(), "ordered_dropout", t)] == list(range(1, 10))
    assert not any(redetects(_cfg(), "fluid_static", t) for t in range(10))
    w, plan = _workload()
    x = next(c for c in range(CLIENTS) if c not in plan.stragglers)
    traj = np.tile(w.speed, (ROUNDS, 1))
    traj[1:, x] *= 10.0  # x busy from round 1 on: seen after round 1, acted on at the next re-plan (round 4)
    h = _run(with_trajectory(w, traj), plan, cfg, "random_dropout")
    assert [x in s for s in h.stragglers] == [False, False, False, False, True, True, True]
    with pytest.raises(ValueError, match="redetect_every"):
        _run(w, plan, _cfg(redetect_every=0), "fluid")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-4, 1e3), min_size=3, max_size=30), st.floats(0.0, 0.5), st.sampled_from([0.1, 0.3, 0.5, 0.9]))
def test_sizes_stay_within_min_r_and_1_and_the_slowest_are_the_stragglers(est, fraction, min_r):
    p = plan_from_estimates(est, 64, fraction, min_r)
    assert all(min_r <= r <= 1.0 for r in p.r.values())
    rest = [e for c, e in enumerate(est) if c not in p.stragglers]
    assert rest and all(est[c] >= max(rest) for c in p.stragglers)
    for c in p.stragglers:  # each the largest grid size whose FLOPs fit the gap (or min_r if none does)
        assert p.r[c] == dr.submodel_size(est[c] / max(rest), 64, 64, 10, min_r)


def test_every_policy_sees_the_same_speeds_stragglers_and_sizes_and_sends_them_their_submodels():
    w, plan = _workload()
    traj = speed_trajectory(w.speed, ROUNDS, 0.35, 3.0, 2, seed=3)
    dyn = with_trajectory(w, traj)
    runs, sizes = {}, {}
    for pol in POLICIES:
        sizes[pol] = []
        runs[pol] = _run(dyn, plan, _cfg(), pol, sizes[pol])
    ref = runs["fluid"]
    assert len({tuple(s) for s in ref.stragglers[1:]}) > 1  # the set really changed in this run
    for pol in ("fedavg_wait", "fedavg_drop", "random_dropout", "ordered_dropout"):
        assert runs[pol].speed == ref.speed and runs[pol].stragglers == ref.stragglers and runs[pol].r == ref.r
    assert runs["fluid_static"].speed == ref.speed and runs["fluid_static"].stragglers != ref.stragglers
    for pol in POLICIES:  # every round, every straggler of the plan in force trains its sub-model
        h = runs[pol]
        for t in range(ROUNDS):
            for c in range(CLIENTS):
                i = h.stragglers[t].index(c) if c in h.stragglers[t] else None
                want = H if pol in ("fedavg_wait", "fedavg_drop") or t == 0 or i is None else dr.keep_count(H, h.r[t][i])
                assert sizes[pol][t][c] == want, (pol, t, c)
            assert all(0.5 <= r <= 1.0 for r in h.r[t])


def test_with_speeds_that_never_change_redetection_is_the_fixed_profile_plan():
    w, plan = _workload()
    still = with_trajectory(w, speed_trajectory(w.speed, ROUNDS, 0.0, 3.0, 2, seed=3))
    for cfg in (_cfg(), _cfg(faulty_clients=3)):  # the excluded clients keep their last estimate
        dyn, fixed = _run(still, plan, cfg, "fluid"), _run(still, plan, cfg, "fluid_static")
        assert dyn.stragglers == fixed.stragglers == [plan.stragglers] * ROUNDS
        assert dyn.r == fixed.r and dyn.accuracy == fixed.accuracy and dyn.kept_fraction == fixed.kept_fraction
        assert [[c[:2] for c in d] for d in dyn.trained] == [[c[:2] for c in d] for d in fixed.trained]
        assert np.allclose(np.asarray(dyn.theta, float), np.asarray(fixed.theta, float), equal_nan=True)
    # and the same as a workload with no trajectory at all (today's fixed speeds)
    assert _run(w, plan, _cfg(faulty_clients=3), "fluid").accuracy == dyn.accuracy
    # with changing speeds the two part ways (so the check above can fail)
    moving = with_trajectory(w, speed_trajectory(w.speed, ROUNDS, 0.35, 3.0, 2, seed=3))
    assert _run(moving, plan, _cfg(), "fluid").stragglers != _run(moving, plan, _cfg(), "fluid_static").stragglers


def test_rescaling_and_round_times_take_per_round_speeds():
    speed = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 2.0]])  # client 0 busy (3x) in round 2
    trained = [[(0, 8, 1.0, 0.0), (1, 8, 1.0, 0.0)]] * 3
    robust, raw = round_times(trained, speed)
    assert robust == pytest.approx([2.0, 2.0, 3.0]) and raw == robust
    assert round_times(trained, speed[0])[0] == pytest.approx([2.0, 2.0, 2.0])  # one row: every round
    with pytest.raises(ValueError):
        round_times(trained, speed[:2])
    scaled = rescale_stragglers(speed, [1], 2.0)
    assert np.array_equal(scaled[:, 1], [4.0, 4.0, 4.0]) and np.array_equal(scaled[:, 0], speed[:, 0])


def test_params_build_a_changing_workload_whose_default_straggler_set_changes():
    p = Params.for_scale("quick")
    assert (p.busy_prob, p.busy_slowdown, p.busy_rounds, p.redetect_every) == (0.05, 2.0, 4, 1)
    w = p.workload(0)
    traj = w.speeds(p.rounds)
    assert traj.shape == (p.rounds, p.clients) and np.array_equal(traj[0], w.speed)
    assert np.array_equal(traj, p.workload(0).speeds(p.rounds))
    flops = profile_flops(w, p.hidden, p.local_epochs)
    profile = p.plan(w).stragglers
    plans = [plan_from_estimates(flops * traj[t - 1] / (p.ref_gflops * 1e9), p.hidden, p.straggler_fraction,
                                 p.min_submodel).stragglers for t in range(1, p.rounds)]
    assert plans[0] == profile and sum(s != profile for s in plans) >= 3  # the quick default moves the set
    cfg = p.config(0)
    assert (cfg.redetect_every, cfg.min_r, cfg.straggler_fraction) == (1, p.min_submodel, p.straggler_fraction)
    still = Params.for_scale("quick", busy_prob=0.0).workload(0)
    assert np.array_equal(still.speeds(p.rounds), np.tile(still.speed, (p.rounds, 1)))


@pytest.mark.parametrize("bad,field", [(dict(busy_prob=1.5), "busy_prob"), (dict(busy_slowdown=0.5), "busy_slowdown"),
                                      (dict(busy_rounds=0), "busy_rounds"), (dict(redetect_every=0), "redetect_every")])
def test_bad_dynamic_parameters_fail_naming_the_field(bad, field):
    with pytest.raises(ParamsError) as e:
        Params.for_scale("smoke", **bad)
    assert e.value.field == field

